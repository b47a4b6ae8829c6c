// SimKernel: the real address space behind simulated mappings: reserving real (NORESERVE)
// ranges for them, unmapping those, and the cache of reserved ranges.
//
// The real reservation is how Python can write into a simulated buffer; it is never part of
// the simulated accounting (TASK_SIZE, RLIMIT_AS and overcommit are the simulated host's, in
// sim_mmap.cpp). When the analyst's own process cannot reserve the range (its `ulimit -v`, a
// small VM, vm.max_map_count), the mapping gets an unbacked range instead: addresses that no
// real page can back on any architecture, so the verdict is the same and only writing through
// the pointer differs (it faults). See docs/kernel-model.md section 6.
#include <linux/mempolicy.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>

#include "kernel/crash_record.h"
#include "kernel/sim_kernel.h"
#include "kernel/sim_mm_util.h"

namespace umbp {

using namespace sim_mm;  // NOLINT(build/namespaces)

namespace {

// [kUnbackedLo, kUnbackedHi): 2^55 bytes no user page can be mapped at: non-canonical on x86_64
// (4- and 5-level paging: bit 56 set, bits 63..57 clear), and on arm64, whose loads ignore the
// top byte, bit 55 set: the kernel's half. Positive as a long (SysResult::value), never NULL.
constexpr uintptr_t kUnbackedLo = uintptr_t{0x0180} << 48;
constexpr uintptr_t kUnbackedHi = uintptr_t{0x0200} << 48;

bool unbacked(uintptr_t a) { return a >= kUnbackedLo && a < kUnbackedHi; }

// The free parts of the unbacked range, shared by every SimKernel of the process (so that two
// kernels never hand out the same address, as with real reservations). A leaf lock.
class UnbackedSpace {
 public:
  UnbackedSpace() { free_.emplace(kUnbackedLo, kUnbackedHi); }

  // The lowest aligned free range of len bytes, or exactly [at, at + len) when `at` is given;
  // 0 when there is none.
  uintptr_t take(uint64_t len, uint64_t align, uintptr_t at) {
    std::lock_guard<std::mutex> lock(mu_);
    if (at) {
      auto it = free_.upper_bound(at);
      if (it == free_.begin()) return 0;
      --it;
      return at < it->second && len <= it->second - at ? split(it, at, len) : 0;
    }
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      const uintptr_t start = round_up(it->first, align);
      if (start < it->second && len <= it->second - start) return split(it, start, len);
    }
    return 0;
  }

  // [start, end) is free again (merged with its free neighbours).
  void give(uintptr_t start, uintptr_t end) {
    std::lock_guard<std::mutex> lock(mu_);
    auto next = free_.lower_bound(start);
    if (next != free_.end() && next->first == end) {
      end = next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->second == start) {
        prev->second = end;
        return;
      }
    }
    free_.emplace(start, end);
  }

  // fork(): the child gets the table in a consistent state (pthread_atfork).
  void lock() { mu_.lock(); }
  void unlock() { mu_.unlock(); }

 private:
  uintptr_t split(std::map<uintptr_t, uintptr_t>::iterator it, uintptr_t start, uint64_t len) {
    const uintptr_t lo = it->first, hi = it->second;
    free_.erase(it);
    if (start > lo) free_.emplace(lo, start);
    if (start + len < hi) free_.emplace(start + len, hi);
    return start;
  }

  std::mutex mu_;
  std::map<uintptr_t, uintptr_t> free_;  // start -> end
};

UnbackedSpace& unbacked_space() {
  // Never destroyed: a SimKernel may be destroyed during static destruction.
  static UnbackedSpace* space = [] {
    auto* s = new UnbackedSpace;
    ::pthread_atfork([] { unbacked_space().lock(); }, [] { unbacked_space().unlock(); },
                     [] { unbacked_space().unlock(); });
    return s;
  }();
  return *space;
}

}  // namespace

bool SimKernel::backed(uintptr_t addr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = vmas_.upper_bound(addr);
  if (it == vmas_.begin()) return false;
  --it;
  return addr < it->second.end && it->second.real_rw;
}

void SimKernel::register_fork_handlers() { unbacked_space(); }

int SimKernel::reserve_real(uintptr_t hint, uint64_t len, uint64_t align, bool fixed,
                            uintptr_t* out, bool* writable) {
  const int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  static const uint64_t real_page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  auto try_map = [&](void* at, uint64_t n, int extra) -> void* {
    *writable = true;
    void* p = ::mmap(at, n, PROT_READ | PROT_WRITE, flags | extra, -1, 0);
    // A host in overcommit mode 2 charges even NORESERVE: PROT_NONE is always free.
    if (p == MAP_FAILED) {
      p = ::mmap(at, n, PROT_NONE, flags | extra, -1, 0);
      if (p != MAP_FAILED) real_cache_ok_ = false;
      *writable = false;
    }
    return p;
  };
  *writable = true;
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
  if (fixed && unbacked(hint)) {
    if (!unbacked_space().take(len, align, hint)) return ENOMEM;
    *out = hint;
    *writable = false;
    return 0;
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
  if (hint && unbacked(hint)) {
    const uintptr_t want = round_up(hint, align);
    if (unbacked(want) && unbacked_space().take(len, align, want)) {
      *out = want;
      *writable = false;
      return 0;
    }
  } else if (hint) {
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
  if (p == MAP_FAILED) {
    // The analyst's process has no room (its RLIMIT_AS, its memory): not the simulated host's
    // business. An unbacked range keeps the simulation going.
    const uintptr_t start = unbacked_space().take(len, align, 0);
    if (!start) return ENOMEM;
    *out = start;
    *writable = false;
    return 0;
  }
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
  if (unbacked(start)) {
    unbacked_space().give(start, end);
    return;
  }
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
