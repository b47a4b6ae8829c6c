// SimKernel: the real address space behind simulated mappings: reserving real (NORESERVE)
// ranges for them, unmapping those, and the cache of reserved ranges.
#include <linux/mempolicy.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "kernel/crash_record.h"
#include "kernel/sim_kernel.h"
#include "kernel/sim_mm_util.h"

namespace umbp {

using namespace sim_mm;  // NOLINT(build/namespaces)

int SimKernel::reserve_real(uintptr_t hint, uint64_t len, uint64_t align, bool fixed,
                            uintptr_t* out) {
  const int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  static const uint64_t real_page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  auto try_map = [&](void* at, uint64_t n, int extra) -> void* {
    void* p = ::mmap(at, n, PROT_READ | PROT_WRITE, flags | extra, -1, 0);
    // A host in overcommit mode 2 charges even NORESERVE: PROT_NONE is always free.
    if (p == MAP_FAILED) {
      p = ::mmap(at, n, PROT_NONE, flags | extra, -1, 0);
      if (p != MAP_FAILED) real_cache_ok_ = false;
    }
    return p;
  };
  if (!fixed && !hint && align <= real_page && real_cache_ok_) {
    auto it = real_cache_.find(len);
    if (it != real_cache_.end() && !it->second.empty()) {
      uintptr_t start = it->second.back();
      it->second.pop_back();
      std::memset(reinterpret_cast<void*>(start), 0, len);  // fresh anonymous memory is zero
      *out = start;
      return 0;
    }
  }
  if (fixed) {
    real_cache_evict(hint, hint + len);
    void* p = try_map(reinterpret_cast<void*>(hint), len, MAP_FIXED_NOREPLACE);
    if (p == MAP_FAILED) return errno == EEXIST ? ENOMEM : errno;
    if (reinterpret_cast<uintptr_t>(p) != hint) {
      ::munmap(p, len);
      return ENOMEM;
    }
    *out = hint;
    return 0;
  }
  if (hint) {
    uintptr_t want = round_up(hint, align);
    void* p = try_map(reinterpret_cast<void*>(want), len, 0);
    if (p != MAP_FAILED && reinterpret_cast<uintptr_t>(p) == want) {
      *out = want;
      return 0;
    }
    if (p != MAP_FAILED) ::munmap(p, len);
  }
  // Over-map by the alignment and trim, unless the real page size already aligns it.
  uint64_t total = align <= real_page ? len : len + align;
  if (total < len) return ENOMEM;
  void* p = try_map(nullptr, total, 0);
  if (p == MAP_FAILED) return ENOMEM;
  uintptr_t base = reinterpret_cast<uintptr_t>(p);
  uintptr_t start = round_up(base, align);
  if (start > base) ::munmap(p, start - base);
  uintptr_t tail = start + len;
  if (base + total > tail) ::munmap(reinterpret_cast<void*>(tail), base + total - tail);
  *out = start;
  return 0;
}

void SimKernel::real_unmap(uintptr_t start, uintptr_t end) {
  if (end <= start) return;
  const uint64_t len = end - start;
  if (len <= kRealCacheMaxLen && real_cache_ok_) {
    auto& free_list = real_cache_[len];
    if (free_list.size() < kRealCachePerLen) {
      free_list.push_back(start);
      return;
    }
  }
  ::munmap(reinterpret_cast<void*>(start), len);
}

// Really unmap cached ranges that overlap [start, end): a MAP_FIXED mapping wants that space.
void SimKernel::real_cache_evict(uintptr_t start, uintptr_t end) {
  for (auto& [len, starts] : real_cache_) {
    for (size_t i = 0; i < starts.size();) {
      if (starts[i] < end && starts[i] + len > start) {
        ::munmap(reinterpret_cast<void*>(starts[i]), len);
        starts[i] = starts.back();
        starts.pop_back();
      } else {
        ++i;
      }
    }
  }
}

}  // namespace umbp
