#include <atomic>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>

#include "allocator/allocator_state.h"

namespace umbp {

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

int Log2(size_t v) { return __builtin_ctzll(static_cast<unsigned long long>(v)); }

HostBufferBacking Demoted(HostBufferBacking b) {
  return b == HostBufferBacking::AnonymousShmHugetlb ? HostBufferBacking::AnonymousShm
                                                     : HostBufferBacking::Anonymous;
}

uint64_t NextSerial() {
  static std::atomic<uint64_t> serial{0};
  return ++serial;
}

}  // namespace umbp
