// A stand-in for a mori checkout's allocator header (tests/external/test_build_mori.py): the
// declarations umbp-sim's binding uses, as mori 624002c's public header declares them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace mori::umbp {

enum class HostBufferBacking : int {
  kAnonymous = 0,
  kAnonymousHugetlb = 1,
  kAnonymousShm = 2,
  kAnonymousShmHugetlb = 3,
};

struct HostBufferOptions {
  HostBufferBacking backing = HostBufferBacking::kAnonymous;
  size_t hugepage_size = 2ULL * 1024 * 1024;
  int numa_node = -1;
  bool prefault = true;
};

struct HostBufferHandle {
  void* ptr = nullptr;
  size_t requested_size = 0;
  size_t mapped_size = 0;
  HostBufferBacking actual_backing = HostBufferBacking::kAnonymous;
  size_t actual_alignment = 0;
  bool valid() const { return ptr != nullptr; }
};

class HostMemAllocator {
 public:
  struct ShmAllocation {
    void* base = nullptr;
    size_t mapped_size = 0;
    int fd = -1;
  };

  HostBufferHandle Alloc(size_t size, const HostBufferOptions& opts);
  void Free(HostBufferHandle& handle);

  static std::optional<ShmAllocation> LookupShmAllocation(uintptr_t ptr, size_t size);
  static std::optional<ShmAllocation> AcquireShmAllocation(uintptr_t ptr, size_t size);
  static void ReleaseShmAllocation(uintptr_t base);
};

}  // namespace mori::umbp
