// The values the allocators hand out and keep: a buffer's backing, its handle, the records of
// the process's tables, and where warnings go.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace umbp {

enum class HostBufferBacking : int {
  Anonymous = 0,            // MAP_PRIVATE|MAP_ANONYMOUS, base pages
  AnonymousHugetlb = 1,     // + MAP_HUGETLB and the MAP_HUGE_* size bits
  AnonymousShm = 2,         // memfd + ftruncate + MAP_SHARED; fd kept for hand-off
  AnonymousShmHugetlb = 3,  // memfd with MFD_HUGETLB and the size bits
};

// "Anonymous", "AnonymousHugetlb", ...; "Unknown(<n>)" for values outside the enum.
std::string BackingName(HostBufferBacking backing);
bool IsHugetlb(HostBufferBacking backing);
bool IsShm(HostBufferBacking backing);

struct HostBufferHandle {
  void* ptr = nullptr;
  size_t requested_size = 0;
  size_t mapped_size = 0;  // request rounded up to actual_alignment
  HostBufferBacking actual_backing = HostBufferBacking::Anonymous;
  size_t actual_alignment = 0;  // the page size backing the mapping
  int fd = -1;                  // memfd of Shm backings (owned by the allocator), else -1
  int numa_node = -1;           // node the mapping is bound to (mbind succeeded), else -1
  uint64_t serial = 0;          // which allocation (unique in the real process); tells a stale
                                // copy from the live buffer at a reused address
  uint64_t kernel_id = 0;       // Kernel::id() of the kernel it was mapped on

  bool valid() const { return ptr != nullptr; }
};

// A warning: its level, its stable id (warning_texts.h) and its text.
enum class LogLevel { Info, Warning };
using LogSink = std::function<void(LogLevel, const std::string& id, const std::string& text)>;

// One buffer returned by Alloc and not yet freed.
struct LiveBuffer {
  void* ptr = nullptr;
  size_t requested_size = 0;
  size_t mapped_size = 0;
  HostBufferBacking backing = HostBufferBacking::Anonymous;
  size_t alignment = 0;
  int fd = -1;
  int numa_node = -1;
  uint64_t serial = 0;
};

// One shm registry record; pending_free = freed by its owner, unmapped at the last release.
struct ShmRegistryEntry {
  void* base = nullptr;
  size_t mapped_size = 0;
  int fd = -1;
  size_t active_registrations = 0;
  bool pending_free = false;
};

}  // namespace umbp
