// The helpers of allocator_format.h, and BackingName and friends of host_buffer.h.
#include "allocator/allocator_format.h"

#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>

namespace umbp {

std::string BackingName(HostBufferBacking b) {
  switch (b) {
    case HostBufferBacking::Anonymous:
      return "Anonymous";
    case HostBufferBacking::AnonymousHugetlb:
      return "AnonymousHugetlb";
    case HostBufferBacking::AnonymousShm:
      return "AnonymousShm";
    case HostBufferBacking::AnonymousShmHugetlb:
      return "AnonymousShmHugetlb";
  }
  return "Unknown(" + std::to_string(static_cast<int>(b)) + ")";
}

bool IsHugetlb(HostBufferBacking b) {
  return b == HostBufferBacking::AnonymousHugetlb || b == HostBufferBacking::AnonymousShmHugetlb;
}

bool IsShm(HostBufferBacking b) {
  return b == HostBufferBacking::AnonymousShm || b == HostBufferBacking::AnonymousShmHugetlb;
}

std::string ErrName(int e) {
  if (const char* n = strerrorname_np(e)) return n;
  return "errno " + std::to_string(e);
}

std::string MoriErr(int e) {
  static std::mutex mu;  // strerror's buffer for unknown values is shared
  std::lock_guard<std::mutex> lock(mu);
  return std::to_string(e) + ": " + std::strerror(e);
}

std::string Hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%lx",
                static_cast<unsigned long>(reinterpret_cast<uintptr_t>(p)));
  return buf;
}

std::string BasePages(size_t page) {
  return page % 1024 == 0 ? std::to_string(page / 1024) + " KiB" : std::to_string(page) + " B";
}

std::string HugeKb(size_t hp) { return std::to_string(hp / 1024) + " kB"; }

bool IsPowerOfTwo(size_t v) { return v != 0 && (v & (v - 1)) == 0; }

std::optional<size_t> AlignUp(size_t size, size_t alignment) {
  if (!IsPowerOfTwo(alignment)) return std::nullopt;
  if (size > std::numeric_limits<size_t>::max() - (alignment - 1)) return std::nullopt;
  return (size + alignment - 1) & ~(alignment - 1);
}

int HugeSizeBits(size_t hp) {
  constexpr int kHugeShift = 26;  // MAP_HUGE_SHIFT == MFD_HUGE_SHIFT
  const int log2 = __builtin_ctzll(static_cast<unsigned long long>(hp));
  return static_cast<int>(static_cast<unsigned>(log2) << kHugeShift);
}

HostBufferBacking Demoted(HostBufferBacking b) {
  return b == HostBufferBacking::AnonymousShmHugetlb ? HostBufferBacking::AnonymousShm
                                                     : HostBufferBacking::Anonymous;
}

}  // namespace umbp
