// Simulated mappings: their real pages are trapped (PROT_NONE, or registered with userfaultfd)
// except the runs granted after a fault, and the real memory behind them is bounded by the
// resident limit.
#include <string.h>

#include <algorithm>

#include "interposer/interposer_internal.h"

namespace umbp_interpose {

namespace {
constexpr int kMaxMaps = 8192;
constexpr int kMaxGrants = 16384;
// Other grants (a run growing towards a big block, the tail of a mapping) stay this small, so
// real memory stays within the limit: big block + small grants.
constexpr size_t kSmallMax = size_t{2} << 20;
}  // namespace

std::mutex g_map_mu;
Map g_maps[kMaxMaps];
int g_nmaps = 0;
Grant g_grants[kMaxGrants];  // FIFO, oldest first
int g_ngrants = 0;
size_t g_res_big = 0, g_res_small = 0;
size_t g_resident_limit = size_t{48} << 20;  // one big block (3/4) + small grants (1/4)

Map* find_map(uintptr_t a) {
  for (int i = 0; i < g_nmaps; ++i)
    if (a >= g_maps[i].start && a < g_maps[i].end) return &g_maps[i];
  return nullptr;
}

bool overlaps_sim_map(uintptr_t lo, uintptr_t hi) {
  std::lock_guard<std::mutex> l(g_map_mu);
  for (int i = 0; i < g_nmaps; ++i) {
    const Map& m = g_maps[i];
    if (hi > lo ? (m.start < hi && lo < m.end) : (lo >= m.start && lo < m.end)) return true;
  }
  return false;
}

void add_map(uintptr_t start, uintptr_t end, int prot, bool uffd) {
  if (g_nmaps >= kMaxMaps) return;
  g_maps[g_nmaps++] = Map{start, end, prot, 0, 0, uffd};
}

namespace {

void erase_grant(int i) {
  const Grant& g = g_grants[i];
  (g.big ? g_res_big : g_res_small) -= g.end - g.start;
  memmove(&g_grants[i], &g_grants[i + 1], sizeof(Grant) * static_cast<size_t>(g_ngrants - i - 1));
  --g_ngrants;
}

void push_grant(uintptr_t start, uintptr_t end, bool big) {
  if (g_ngrants == kMaxGrants) erase_grant(0);  // table full: forget the oldest (stays mapped)
  g_grants[g_ngrants++] = Grant{start, end, big};
  (big ? g_res_big : g_res_small) += end - start;
}

}  // namespace

// Forget [lo, hi) in the mapping and grant tables (its real pages are being replaced). What is
// left of a big grant cut in part becomes small grants.
void forget_range(uintptr_t lo, uintptr_t hi) {
  for (int i = 0; i < g_ngrants;) {
    const Grant g = g_grants[i];
    if (g.end <= lo || g.start >= hi) {
      ++i;
      continue;
    }
    erase_grant(i);
    if (g.start < lo) push_grant(g.start, lo, false);
    if (g.end > hi) push_grant(hi, g.end, false);
  }
  for (int i = 0; i < g_nmaps;) {
    Map& m = g_maps[i];
    if (m.end <= lo || m.start >= hi) {
      ++i;
      continue;
    }
    if (m.start < lo && m.end > hi) {
      const Map tail{hi, m.end, m.prot, 0, 0, m.uffd};
      m.end = lo;
      add_map(tail.start, tail.end, tail.prot, tail.uffd);
      ++i;
    } else if (m.start < lo) {
      m.end = lo;
      ++i;
    } else if (m.end > hi) {
      m.start = hi;
      ++i;
    } else {
      g_maps[i] = g_maps[--g_nmaps];
    }
  }
}

namespace {

// Real pages for [start, end) of mapping `m`, within the resident limit. A big grant (an aligned
// 32 MiB block) takes fresh memory until big grants fill 3/4 of the limit, then the pages of the
// oldest big grant are moved here (mremap moves the page table, a transparent hugepage in one
// entry; contents go with them, nothing is zeroed). A small grant takes fresh pages; the oldest
// small grants are dropped (MADV_DONTNEED) to stay within the rest of the limit. Fresh memory is
// made accessible (PROT_NONE path) or filled (userfaultfd path, `write`: the faulting access).
bool grant(const Map& m, uintptr_t start, uintptr_t end, bool write) {
  const int prot = m.prot & (PROT_READ | PROT_WRITE | PROT_EXEC);
  const size_t len = end - start;
  const bool big = start % kBig == 0 && len == kBig;
  const size_t big_limit = g_resident_limit / 4 * 3;
  const size_t small_limit = g_resident_limit - big_limit;
  auto fresh = [&] {
    if (!m.uffd) return sys_mprotect(reinterpret_cast<void*>(start), len, prot) == 0;
    if (!big) return uffd_fill(start, end, write);
    // A big block leaves the registration instead: the real kernel fills it with transparent
    // hugepages (16 faults), which later moves take as 16 page-table entries (filled here with
    // UFFDIO_COPY it would be 8192 small pages, and every move of it 8192 entries).
    if (!uffd_unregister(start, len)) return false;
    raw_madvise(start, len, MADV_HUGEPAGE);
    return true;
  };
  if (big) {
    int oldest = -1;
    if (g_res_big + kBig > big_limit)
      for (int i = 0; i < g_ngrants && oldest < 0; ++i)
        if (g_grants[i].big) oldest = i;
    if (oldest < 0) {
      if (!fresh()) return false;
      push_grant(start, end, true);
      return true;
    }
    const uintptr_t from = g_grants[oldest].start;
    void* src = reinterpret_cast<void*>(from);
    void* dst = reinterpret_cast<void*>(start);
    if (sys_mremap(src, kBig, kBig, MREMAP_MAYMOVE | MREMAP_FIXED, dst) == MAP_FAILED) return false;
    // The source is a hole now: fill it back as untouched space (a fresh VMA that merges with
    // its neighbours, so the number of real VMAs stays bounded): PROT_NONE, or registered.
    const Map* owner = find_map(from);
    if (owner && owner->uffd) {
      sys_mmap(src, kBig, owner->prot & (PROT_READ | PROT_WRITE | PROT_EXEC),
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
      raw_madvise(from, kBig, MADV_NOHUGEPAGE);  // as its registered neighbours (see trap)
      uffd_register(from, kBig);
    } else {
      sys_mmap(src, kBig, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
               0);
      raw_madvise(from, kBig, MADV_HUGEPAGE);
    }
    if (prot != (PROT_READ | PROT_WRITE)) sys_mprotect(dst, kBig, prot);
    g_moved.fetch_add(1, std::memory_order_relaxed);
    erase_grant(oldest);
    push_grant(start, end, true);
    return true;
  }
  while (g_res_small + len > small_limit) {
    int oldest = -1;
    for (int i = 0; i < g_ngrants && oldest < 0; ++i)
      if (!g_grants[i].big) oldest = i;
    if (oldest < 0) break;
    const Grant g = g_grants[oldest];
    raw_madvise(g.start, g.end - g.start, MADV_DONTNEED);
    const Map* owner = find_map(g.start);
    if (owner && owner->uffd)
      uffd_register(g.start, g.end - g.start);  // missing again (a moved block's rest: re-register)
    else
      sys_mprotect(reinterpret_cast<void*>(g.start), g.end - g.start, PROT_NONE);
    erase_grant(oldest);
  }
  if (!fresh()) return false;
  push_grant(start, end, false);
  return true;
}

}  // namespace

// A fault at `addr` inside simulated mapping `m` (g_map_mu held; a SIGSEGV on the PROT_NONE
// path, a missing page on the userfaultfd path; `write`: the access): ask the Kernel, grant.
// Sequential faults grant runs that double up to an aligned 32 MiB block (other grants: at most
// 2 MiB). Returns 0 with the run granted in *granted_end, or the signal the Kernel answered with.
int handle_fault(const umbp_sim_kernel* k, Map& m, uintptr_t addr, bool write,
                 uintptr_t* granted_end) {
  const uintptr_t p = align_down(addr, g_page);
  m.run = (m.next_seq == p && m.run) ? std::min(m.run * 2, kBig) : g_page;
  uintptr_t end = std::min<uintptr_t>(align_down(p, m.run) + m.run, m.end);
  if (end <= p) end = std::min<uintptr_t>(p + g_page, m.end);
  if (!(p % kBig == 0 && end - p == kBig)) end = std::min<uintptr_t>(end, p + kSmallMax);
  for (int i = 0; i < g_ngrants; ++i)  // never over an existing grant
    if (g_grants[i].start > p && g_grants[i].start < end) end = g_grants[i].start;
  umbp_sim_result r = k->ops->touch(k->self, reinterpret_cast<void*>(p), end - p, g_page);
  if (r.signal) return r.signal;
  if (r.error) return SIGSEGV;
  if (!grant(m, p, end, write)) return SIGSEGV;
  m.next_seq = end;
  *granted_end = end;
  g_faults.fetch_add(1, std::memory_order_relaxed);
  return 0;
}

// Trap touches of [start, end), a new simulated mapping with protection `prot`: register it
// (userfaultfd path, at its real protection) or make it PROT_NONE. Returns whether registered.
bool trap(uintptr_t start, uintptr_t end, int prot) {
  if (g_path.load(std::memory_order_relaxed) == UMBP_SIM_FAULT_PATH_UFFD) {
    sys_mprotect(reinterpret_cast<void*>(start), end - start,
                 prot & (PROT_READ | PROT_WRITE | PROT_EXEC));
    if (uffd_register(start, end - start)) return true;
  }
  sys_mprotect(reinterpret_cast<void*>(start), end - start, PROT_NONE);
  return false;
}

}  // namespace umbp_interpose
