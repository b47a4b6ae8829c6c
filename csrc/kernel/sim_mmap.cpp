// SimKernel: mmap, munmap, madvise and touch (kernel-model.md sections 1, 2, 4, 6).
// Faults are accounting only: real memory behind a mapping is never touched here.
#include <linux/mempolicy.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "kernel/sim_kernel.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

namespace umbp {

namespace {
constexpr int kMadvPopulateRead = 22;
constexpr int kMadvPopulateWrite = 23;
constexpr int kMapHugeShift = 26;
constexpr int kMapHugeMask = 0x3f;

uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

std::string kb(uint64_t bytes) { return std::to_string(bytes / 1024) + " kB"; }
std::string str(int64_t v) { return std::to_string(v); }
int64_t i64(uint64_t v) { return static_cast<int64_t>(v); }

std::string node_list(const std::vector<int>& nodes) {
  std::string s;
  for (int n : nodes) s += (s.empty() ? "" : ",") + std::to_string(n);
  return s.empty() ? "none" : s;
}

// madvise advice values this model accepts (6.x), POPULATE gated on version separately.
bool known_advice(int a) {
  return (a >= 0 && a <= 4) || (a >= 8 && a <= 25) || (a >= 100 && a <= 103);
}
}  // namespace

// ---- real address space -----------------------------------------------------------------

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

// ---- accounting -------------------------------------------------------------------------

// __vm_enough_memory: 0 or ENOMEM; charges Committed_AS on success.
int SimKernel::commit_check(uint64_t bytes, uint64_t /*new_vm_bytes*/) {
  const uint64_t ps = cfg_.page_size;
  const uint64_t pages = bytes / ps;
  if (cfg_.overcommit_memory == 0) {
    if (pages > cfg_.mem_total / ps + cfg_.swap_total / ps) {
      fail(ENOMEM, "mmap", "overcommit_heuristic",
           "overcommit_memory 0 refuses a single mapping larger than RAM + swap: " +
               str(i64(bytes)) + " bytes > MemTotal " + str(i64(cfg_.mem_total)) + " + SwapTotal " +
               str(i64(cfg_.swap_total)),
           {{"length", i64(bytes)},
            {"mem_total", i64(cfg_.mem_total)},
            {"swap_total", i64(cfg_.swap_total)}});
      return ENOMEM;
    }
  } else if (cfg_.overcommit_memory == 2) {
    int64_t allowed = static_cast<int64_t>(commit_limit_locked() / ps);
    if (!cfg_.root) allowed -= static_cast<int64_t>(cfg_.admin_reserve_kbytes * 1024 / ps);
    uint64_t vm = cfg_.base_vm;
    for (const auto& [s, v] : vmas_) vm += v.len();
    int64_t reserve = static_cast<int64_t>(cfg_.user_reserve_kbytes * 1024 / ps);
    allowed -= std::min(static_cast<int64_t>(vm / ps / 32), reserve);
    int64_t committed = static_cast<int64_t>((cfg_.committed_as + committed_) / ps + pages);
    if (committed >= allowed) {
      const int64_t before = static_cast<int64_t>(cfg_.committed_as + committed_);
      fail(ENOMEM, "mmap", "commit_limit",
           "overcommit_memory 2 (strict): Committed_AS " + str(before) + " + " + str(i64(bytes)) +
               " bytes must stay under CommitLimit " + str(i64(commit_limit_locked())) +
               " less the reserves (" + str(allowed * static_cast<int64_t>(ps)) + " allowed)",
           {{"length", i64(bytes)},
            {"committed_as", before},
            {"commit_limit", i64(commit_limit_locked())},
            {"limit", allowed * static_cast<int64_t>(ps)}});
      return ENOMEM;
    }
  }
  committed_ += bytes;
  return 0;
}

// ---- VMAs -------------------------------------------------------------------------------

std::map<uintptr_t, SimVma>::iterator SimKernel::split_vma(uintptr_t at) {
  auto it = vmas_.upper_bound(at);
  if (it == vmas_.begin()) return vmas_.end();
  --it;
  SimVma& v = it->second;
  if (at <= v.start || at >= v.end) return vmas_.end();
  SimVma tail = v;
  tail.start = at;
  tail.pgoff = v.pgoff + (at - v.start) / v.obj->page;
  v.end = at;
  v.obj->vma_refs++;
  return vmas_.emplace(at, std::move(tail)).first;
}

SysResult SimKernel::munmap_locked(uintptr_t start, uintptr_t end) {
  // Hugetlb VMAs cannot be split inside a hugepage (section 2): check before changing anything.
  auto first = vmas_.upper_bound(start);
  if (first != vmas_.begin()) --first;
  for (auto it = first; it != vmas_.end() && it->first < end; ++it) {
    const SimVma& v = it->second;
    if (v.end <= start || !v.hugetlb()) continue;
    uint64_t hs = v.obj->page;
    if (start > v.start && start < v.end && start % hs) return SysResult::Err(EINVAL);
    if (end > v.start && end < v.end && end % hs) return SysResult::Err(EINVAL);
  }
  split_vma(start);
  split_vma(end);
  for (auto it = vmas_.lower_bound(start); it != vmas_.end() && it->first < end;) {
    SimVma v = it->second;
    it = vmas_.erase(it);
    real_unmap(v.start, v.end);
    if (v.accounted) committed_ -= std::min<uint64_t>(committed_, v.len());
    // Private pages and reservations go back now; a shared object keeps them (section 2).
    if (!v.obj->shared) release_object_range(*v.obj, v.pgoff, v.len() / v.obj->page);
    v.obj->vma_refs--;
    if (v.obj->shared) drop_object_ref(v.obj);
  }
  return SysResult::Ok(0);
}

// ---- mmap -------------------------------------------------------------------------------

SysResult SimKernel::mmap(void* addr, size_t length, int prot, int flags, int fd, off_t offset) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t before = reasons_total_;
  SysResult r = do_mmap(addr, length, prot, flags, fd, offset);
  explain_errno("mmap", r, before);
  return r;
}

SysResult SimKernel::do_mmap(void* addr, size_t length, int prot, int flags, int fd, off_t offset) {
  if (crash_.signal) return SysResult::Crash(crash_.signal);
  const uint64_t ps = cfg_.page_size;
  const uintptr_t hint = reinterpret_cast<uintptr_t>(addr);
  const int type = flags & 0x0f;
  if (type != MAP_SHARED && type != MAP_PRIVATE && type != (MAP_SHARED | MAP_PRIVATE))
    return SysResult::Err(EINVAL);
  const bool shared = type != MAP_PRIVATE;
  const bool anon = flags & MAP_ANONYMOUS;
  const bool fixed = flags & (MAP_FIXED | MAP_FIXED_NOREPLACE);
  if (offset < 0 || static_cast<uint64_t>(offset) % ps) return SysResult::Err(EINVAL);

  SimObjectPtr file;
  SimHState* h = nullptr;
  if (!anon) {
    auto it = fds_.find(fd);
    if (it == fds_.end()) return SysResult::Err(EBADF);
    file = it->second;
    if (file->h)
      h = file->h;
    else if (flags & MAP_HUGETLB)
      return SysResult::Err(EINVAL);
  } else if (flags & MAP_HUGETLB) {
    // Size field: log2 of the hugepage size in bits 26..31 (ignored before 3.8); 0 = default.
    int log = (flags >> kMapHugeShift) & kMapHugeMask;
    if (!version_at_least(3, 8)) log = 0;
    uint64_t size = log ? (uint64_t{1} << log) : cfg_.default_hugepage_size;
    h = size ? hstate(size) : nullptr;
    if (!h) {
      std::string sizes;
      for (uint64_t z : cfg_.hugepage_sizes) sizes += (sizes.empty() ? "" : ", ") + kb(z);
      return fail(EINVAL, "mmap", "hugepage_size_unknown",
                  "this kernel has no " + kb(size) +
                      " hugepages (sizes: " + (sizes.empty() ? std::string("none") : sizes) +
                      "): mmap(MAP_HUGETLB) fails with EINVAL",
                  {{"hugepage_size", i64(size)}});
    }
  }
  if (length == 0) return SysResult::Err(EINVAL);
  const uint64_t unit = h ? h->size : ps;
  uint64_t len = round_up(length, unit);
  if (len < length || len > (uint64_t{1} << 62)) return SysResult::Err(ENOMEM);
  if (h && static_cast<uint64_t>(offset) % h->size) return SysResult::Err(EINVAL);
  if (fixed && hint % unit) return SysResult::Err(EINVAL);

  // MAP_FIXED replaces what is there; the model only replaces its own mappings.
  if (fixed && (flags & MAP_FIXED)) {
    SysResult r = munmap_locked(hint, hint + len);
    if (!r.ok()) return r;
  }
  // RLIMIT_AS counts every VMA, hugetlb and NORESERVE included.
  uint64_t vm = cfg_.base_vm;
  for (const auto& [s, v] : vmas_) vm += v.len();
  if (cfg_.rlimit_as != UINT64_MAX && vm + len > cfg_.rlimit_as)
    return fail(ENOMEM, "mmap", "rlimit_as",
                "RLIMIT_AS (Max address space) is " + str(i64(cfg_.rlimit_as)) +
                    " bytes: the process maps " + str(i64(vm)) + " and asks for " + str(i64(len)) +
                    " more",
                {{"vm", i64(vm)}, {"length", i64(len)}, {"limit", i64(cfg_.rlimit_as)}});

  const bool noreserve = flags & MAP_NORESERVE;
  const bool writable = prot & PROT_WRITE;
  bool accounted = false;
  if (!h) {
    accounted = (!shared && writable) || (shared && anon);
    if (noreserve && cfg_.overcommit_memory != 2) accounted = false;
    if (accounted && commit_check(len, len)) return SysResult::Err(ENOMEM);
  }

  // The backing object and its page index at the mapping start.
  SimObjectPtr obj;
  uint64_t pgoff = 0;
  if (file && shared) {
    obj = file;
    pgoff = static_cast<uint64_t>(offset) / unit;
  } else {
    obj = std::make_shared<SimObject>();
    obj->page = unit;
    obj->h = h;
    obj->shared = shared;
  }
  const uint64_t npages = len / unit;

  // Hugetlb reservation (section 1 steps 1-3; section 5 for MAP_SHARED of a memfd).
  long delta = 0;
  if (h && !noreserve) {
    delta = static_cast<long>(npages - obj->pages.count(pgoff, npages, PageState::Reserved) -
                              obj->pages.count(pgoff, npages, PageState::Faulted));
    auto rm = cfg_.hugetlb_cgroup_rsvd_max.find(h->size);
    if (rm != cfg_.hugetlb_cgroup_rsvd_max.end() && version_at_least(5, 7) &&
        h->cg_rsvd + static_cast<uint64_t>(delta) * h->size > rm->second) {
      if (accounted) committed_ -= len;
      return fail(
          ENOMEM, "mmap", "hugetlb_cgroup_rsvd",
          "the hugetlb cgroup reservation limit for " + kb(h->size) + " pages is " +
              str(i64(rm->second)) + " bytes; " + str(delta) + " pages more do not fit",
          {{"hugepage_size", i64(h->size)}, {"pages_needed", delta}, {"limit", i64(rm->second)}});
    }
    const long free0 = h->free(), resv0 = h->resv, surp0 = h->surp();
    const long short0 = std::max(0L, resv0 + delta - free0);
    long room0 = h->overcommit - surp0;
    if (gigantic(*h) && !version_at_least(6, 19)) room0 = 0;
    SimNumbers pool = {{"hugepage_size", i64(h->size)},
                       {"pages_needed", delta},
                       {"free", free0},
                       {"reserved", resv0},
                       {"available", free0 - resv0},
                       {"surplus", surp0},
                       {"surplus_allowed", h->overcommit}};
    if (delta > 0 && gather_surplus(*h, delta)) {
      if (accounted) committed_ -= len;
      std::string base = "mmap(MAP_HUGETLB) reserves all " + str(delta) + " " + kb(h->size) +
                         " pages at mmap time: HugePages_Free " + str(free0) + " - Rsvd " +
                         str(resv0) + " = " + str(free0 - resv0) + " available, " + str(short0) +
                         " short";
      if (room0 < short0) {
        return fail(ENOMEM, "mmap", "hugetlb_reserve",
                    base + "; nr_overcommit_hugepages " + str(h->overcommit) + " with " +
                        str(surp0) + " surplus in use allows " + str(std::max(0L, room0)) +
                        " more: ENOMEM",
                    pool);
      }
      long obtainable = 0;
      for (int n : memory_nodes()) obtainable += node_obtainable(n) / static_cast<long>(h->size);
      pool.push_back({"surplus_obtainable", obtainable});
      return fail(ENOMEM, "mmap", "hugetlb_surplus_no_memory",
                  base + "; nr_overcommit_hugepages allows them as surplus pages, but the " +
                      "buddy allocator has only " + str(obtainable) + " free " + kb(h->size) +
                      " blocks: ENOMEM",
                  pool);
    }
    if (delta > 0 && short0 > 0) {
      note("mmap", "hugetlb_surplus_gathered",
           "mmap(MAP_HUGETLB) reserves " + str(delta) + " " + kb(h->size) +
               " pages: " + str(free0 - resv0) + " available in the pool, and the " + str(short0) +
               " missing were allocated as surplus pages (nr_overcommit_hugepages " +
               str(h->overcommit) + ", surplus now " + str(h->surp()) + ")",
           pool);
    } else if (delta > 0) {
      note("mmap", "hugetlb_reserved",
           "mmap(MAP_HUGETLB) reserves " + str(delta) + " " + kb(h->size) +
               " pages from the global pool (HugePages_Free " + str(free0) + " - Rsvd " +
               str(resv0) + " = " + str(free0 - resv0) +
               " available); which node gives them is decided at fault time",
           pool);
    }
    if (delta > 0 && version_at_least(5, 9) && task_policy_.mode == MPOL_BIND) {
      long allowed = 0;
      for (int n : task_policy_.nodes) allowed += h->node[n].free;
      if (delta > allowed) {
        return_unused_surplus(*h, delta);
        return fail(ENOMEM, "mmap", "hugetlb_reserve_mpol_bind",
                    "the task's MPOL_BIND nodes have " + str(allowed) + " free " + kb(h->size) +
                        " pages, " + str(delta) + " needed (5.9+ checks them at mmap)",
                    {{"hugepage_size", i64(h->size)}, {"pages_needed", delta}, {"free", allowed}});
      }
    }
  }

  uintptr_t start = 0;
  int err = reserve_real(hint, len, std::max<uint64_t>(unit, 4096), fixed, &start);
  if (err) {
    if (delta > 0) return_unused_surplus(*h, delta);
    if (accounted) committed_ -= len;
    return fail(err, "mmap", "address_space",
                "no room for " + str(i64(len)) + " bytes in the address space",
                {{"length", i64(len)}});
  }
  if (delta > 0) {
    for (const auto& seg : obj->pages.segments(pgoff, npages))
      if (seg.state == PageState::None) obj->pages.assign(seg.start, seg.len, PageState::Reserved);
    h->cg_rsvd += static_cast<uint64_t>(delta) * h->size;
  }
  // hugetlbfs extends the file to cover a writable shared mapping.
  if (file && shared && writable && file->h) {
    file->i_size = std::max<uint64_t>(file->i_size, static_cast<uint64_t>(offset) + len);
  }

  SimVma v;
  v.start = start;
  v.end = start + len;
  v.prot = prot;
  v.flags = flags;
  v.obj = obj;
  v.pgoff = pgoff;
  v.noreserve = noreserve;
  v.accounted = accounted;
  obj->vma_refs++;
  vmas_.emplace(start, v);

  if (flags & MAP_POPULATE) {
    // MAP_POPULATE hides fault failures (section 1); an OOM kill is still a kill.
    SysResult r = populate(start, start + len, writable, "mmap(MAP_POPULATE)", false);
    if (r.signal == SIGKILL) return r;
    crash_ = SimCrash{};
  }
  return SysResult::Ok(static_cast<long>(start));
}

SysResult SimKernel::munmap(void* addr, size_t length) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t before = reasons_total_;
  SysResult r = do_munmap(addr, length);
  explain_errno("munmap", r, before);
  return r;
}

SysResult SimKernel::do_munmap(void* addr, size_t length) {
  if (crash_.signal) return SysResult::Crash(crash_.signal);
  uintptr_t start = reinterpret_cast<uintptr_t>(addr);
  if (start % cfg_.page_size || length == 0) return SysResult::Err(EINVAL);
  uint64_t len = round_up(length, cfg_.page_size);
  if (len < length || start + len < start) return SysResult::Err(EINVAL);
  return munmap_locked(start, start + len);
}

// ---- faults -----------------------------------------------------------------------------

// Nodes a fault may take a page from, in the order it tries them (local = lowest node with
// memory first). INTERLEAVE is spread over its nodes by fault_range.
std::vector<int> SimKernel::fault_order(const SimPolicy& vp, uint64_t) const {
  const SimPolicy& p = (vp.mode == MPOL_DEFAULT) ? task_policy_ : vp;
  std::vector<int> all = memory_nodes();
  if (p.mode == MPOL_BIND) return p.nodes;
  if (p.mode == MPOL_PREFERRED || p.mode == MPOL_INTERLEAVE || p.mode == 5 /*PREFERRED_MANY*/) {
    std::vector<int> out = p.nodes;
    for (int n : all)
      if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
    return out;
  }
  return all;
}

int SimKernel::fault_range(SimVma& v, uint64_t first, uint64_t count, SimReason* why, int* node,
                           uint64_t* hsize) {
  SimObject& o = *v.obj;
  SimHState* h = o.h;
  const SimPolicy& pol = v.policy.mode == MPOL_DEFAULT ? task_policy_ : v.policy;
  std::vector<int> order = fault_order(v.policy, first);
  *node = order.empty() ? -1 : order.front();
  *hsize = h ? h->size : 0;
  uint64_t limit = count;
  // What the allowed nodes hold before this fault: the numbers a failure is explained with.
  long nodes_free0 = 0;
  int64_t mem_free0 = 0, reclaim0 = 0;
  for (int n : order) {
    if (h) nodes_free0 += h->node[n].free;
    mem_free0 += node_mem_free(n);
    auto r = node_reclaim_.find(n);
    if (r != node_reclaim_.end()) reclaim0 += std::max<int64_t>(r->second, 0);
  }
  const long hfree0 = h ? h->free() : 0, hresv0 = h ? h->resv : 0, hsurp0 = h ? h->surp() : 0;
  const uint64_t done0 = o.pages.count(first, count, PageState::Faulted);
  bool beyond_eof = false;
  if (o.is_file) {
    uint64_t eof = o.i_size / o.page;
    if (first + count > eof) {
      limit = eof > first ? eof - first : 0;
      beyond_eof = true;
    }
  }
  for (const auto& seg : o.pages.segments(first, limit)) {
    if (seg.state == PageState::Faulted) continue;
    long need = static_cast<long>(seg.len);
    NodeCounts got;
    long have = 0;
    if (h) {
      auto cm = cfg_.hugetlb_cgroup_max.find(h->size);
      bool cg_limited = false;
      if (cm != cfg_.hugetlb_cgroup_max.end()) {
        long room =
            static_cast<long>((cm->second > h->cg_usage ? cm->second - h->cg_usage : 0) / h->size);
        if (room < need) {
          need = room;
          cg_limited = true;
        }
      }
      // Free pages on the allowed nodes; an unreserved fault also needs free - resv >= 1.
      long cap = need;
      if (seg.state == PageState::None) cap = std::min(cap, std::max(0L, h->free() - h->resv));
      std::vector<std::pair<int, long>> take;
      if (pol.mode == MPOL_INTERLEAVE) {
        std::map<int, long> share;
        long left = cap;
        // Spread over the interleave nodes, then fall back in order.
        std::vector<int> nodes = pol.nodes;
        while (left > 0) {
          long given = 0;
          std::vector<int> live;
          for (int n : nodes)
            if (h->node[n].free - share[n] > 0) live.push_back(n);
          if (live.empty()) break;
          long each = std::max(1L, left / static_cast<long>(live.size()));
          for (int n : live) {
            long k = std::min({each, left - given, h->node[n].free - share[n]});
            share[n] += k;
            given += k;
          }
          left -= given;
          if (!given) break;
        }
        for (int n : order) {
          long k = std::min(left, h->node[n].free - share[n]);
          if (k > 0) {
            share[n] += k;
            left -= k;
          }
        }
        for (int n : order)
          if (share[n] > 0) take.push_back({n, share[n]});
      } else {
        long left = cap;
        for (int n : order) {
          long k = std::min(left, h->node[n].free);
          if (k > 0) take.push_back({n, k});
          left -= std::max(k, 0L);
        }
      }
      for (auto& [n, k] : take) {
        h->node[n].free -= k;
        got.push_back({n, static_cast<uint64_t>(k)});
        have += k;
      }
      // Then surplus pages from the buddy allocator on the same nodes, within overcommit.
      while (have < need) {
        long room = h->overcommit - h->surp();
        if (room <= 0 || (gigantic(*h) && !version_at_least(6, 19))) break;
        long before = have;
        for (int n : order) {
          long k = std::min({need - have, room, node_obtainable(n) / static_cast<long>(h->size)});
          if (k <= 0 || !has_memory(n)) continue;
          node_mem_take(n, static_cast<int64_t>(h->size) * k);
          h->node[n].nr += k;
          h->node[n].surp += k;
          got.push_back({n, static_cast<uint64_t>(k)});
          have += k;
          room -= k;
        }
        if (have == before) break;
      }
      if (seg.state == PageState::Reserved) {
        h->resv -= have;
        h->cg_rsvd -= std::min<uint64_t>(h->cg_rsvd, static_cast<uint64_t>(have) * h->size);
      }
      h->cg_usage += static_cast<uint64_t>(have) * h->size;
      o.pages.assign(seg.start, static_cast<uint64_t>(have), PageState::Faulted, got);
      if (have < static_cast<long>(seg.len)) {
        const int64_t faulted =
            static_cast<int64_t>(o.pages.count(first, count, PageState::Faulted));
        why->signal = SIGBUS;
        why->numbers = {{"hugepage_size", i64(h->size)},
                        {"node", order.empty() ? -1 : order.front()},
                        {"pages_needed", static_cast<int64_t>(count - done0)},
                        {"pages_faulted", faulted - static_cast<int64_t>(done0)},
                        {"node_free", nodes_free0},
                        {"free", hfree0},
                        {"reserved", hresv0},
                        {"surplus", hsurp0},
                        {"surplus_allowed", h->overcommit}};
        if (cg_limited && have == need) {
          why->rule = "hugetlb_cgroup_limit";
          why->numbers.push_back({"limit", i64(cm->second)});
          why->text = "hugetlb cgroup limit " + kb(cm->second) + " reached";
        } else {
          why->rule = "hugetlb_fault_no_page";
          why->text = "no free " + kb(h->size) + " hugepage on node(s) " + node_list(order) +
                      " (HugePages_Free=" + std::to_string(h->free()) +
                      " Rsvd=" + std::to_string(h->resv) + " Surp=" + std::to_string(h->surp()) +
                      " nr_overcommit=" + std::to_string(h->overcommit) + ")";
        }
        return SIGBUS;
      }
    } else {
      // Base pages: charged to the memory cgroup, taken from the nodes' free memory.
      const uint64_t pg = o.page;
      bool memcg_limited = false;
      if (cfg_.memcg_max != UINT64_MAX) {
        long room = static_cast<long>(
            (cfg_.memcg_max > memcg_usage_ ? cfg_.memcg_max - memcg_usage_ : 0) / pg);
        if (room < need) {
          need = room;
          memcg_limited = true;
        }
      }
      // Free memory on the allowed nodes first (in fallback order), then reclaim: page cache
      // and reclaimable slab go before the OOM killer is called.
      std::map<int, uint64_t> by_node;
      for (int pass = 0; pass < 2 && have < need; ++pass) {
        for (int n : order) {
          long cap = pass == 0 ? node_mem_free(n) : node_obtainable(n);
          long k = std::min(need - have, cap / static_cast<long>(pg));
          if (k <= 0) continue;
          node_mem_take(n, static_cast<int64_t>(pg) * k);
          by_node[n] += static_cast<uint64_t>(k);
          have += k;
        }
      }
      for (int n : order)
        if (by_node[n]) got.push_back({n, by_node[n]});
      memcg_usage_ += static_cast<uint64_t>(have) * pg;
      o.pages.assign(seg.start, static_cast<uint64_t>(have), PageState::Faulted, got);
      if (have < static_cast<long>(seg.len)) {
        const int64_t faulted =
            static_cast<int64_t>(o.pages.count(first, count, PageState::Faulted));
        why->signal = SIGKILL;
        why->numbers = {{"node", order.empty() ? -1 : order.front()},
                        {"node_count", static_cast<int64_t>(order.size())},
                        {"bytes_needed", static_cast<int64_t>((count - done0) * pg)},
                        {"bytes_faulted", (faulted - static_cast<int64_t>(done0)) * i64(pg)},
                        {"node_free", mem_free0},
                        {"reclaimable", reclaim0}};
        if (memcg_limited) {
          why->rule = "memcg_oom";
          why->numbers.push_back({"limit", i64(cfg_.memcg_max)});
          why->text = "memory cgroup limit " + kb(cfg_.memcg_max) + " reached: OOM kill";
        } else {
          why->rule = "oom";
          why->text = "out of memory on node(s) " + node_list(order) + ": OOM kill";
        }
        *hsize = 0;
        return SIGKILL;
      }
    }
  }
  if (beyond_eof) {
    why->signal = SIGBUS;
    why->rule = "memfd_beyond_eof";
    why->numbers = {{"file_size", i64(o.i_size)}};
    why->text = "fault beyond the end of the memfd (" + std::to_string(o.i_size) + " bytes)";
    return SIGBUS;
  }
  return 0;
}

// Fault every page of [start, end): MADV_POPULATE_* (is_madvise) or MAP_POPULATE.
SysResult SimKernel::populate(uintptr_t start, uintptr_t end, bool write, const std::string& where,
                              bool is_madvise) {
  uintptr_t pos = start;
  while (pos < end) {
    auto it = vmas_.upper_bound(pos);
    if (it == vmas_.begin()) return SysResult::Err(ENOMEM);
    --it;
    SimVma& v = it->second;
    if (pos >= v.end) return SysResult::Err(ENOMEM);
    if (v.prot == PROT_NONE || (write && !(v.prot & PROT_WRITE))) return SysResult::Err(EINVAL);
    uintptr_t stop = std::min<uintptr_t>(end, v.end);
    uint64_t pg = v.obj->page;
    uint64_t first = v.pgoff + (pos - v.start) / pg;
    uint64_t last = v.pgoff + (round_up(stop - v.start, pg)) / pg;
    SimReason why;
    int node = -1;
    uint64_t hsize = 0;
    int sig = fault_range(v, first, last - first, &why, &node, &hsize);
    if (sig == SIGKILL || (sig && !is_madvise)) return die(where, node, hsize, std::move(why));
    if (sig) {  // SIGBUS during MADV_POPULATE_*: the fault's reason, as EFAULT
      why.call = where;
      why.err = EFAULT;
      why.signal = 0;
      why.text += ": " + where + " returns EFAULT";
      record(std::move(why));
      return SysResult::Err(EFAULT);
    }
    pos = v.end;
  }
  return SysResult::Ok(0);
}

SysResult SimKernel::madvise(void* addr, size_t length, int advice) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t before = reasons_total_;
  SysResult r = do_madvise(addr, length, advice);
  explain_errno("madvise", r, before);
  return r;
}

SysResult SimKernel::do_madvise(void* addr, size_t length, int advice) {
  if (crash_.signal) return SysResult::Crash(crash_.signal);
  const bool populate_advice = advice == kMadvPopulateRead || advice == kMadvPopulateWrite;
  if (populate_advice && !version_at_least(5, 14))
    return fail(EINVAL,
                advice == kMadvPopulateWrite ? "madvise(MADV_POPULATE_WRITE)"
                                             : "madvise(MADV_POPULATE_READ)",
                "populate_unsupported",
                "kernel " + cfg_.kernel_release +
                    " is older than 5.14, which added MADV_POPULATE_READ/WRITE: EINVAL",
                {{"kernel_major", cfg_.kernel_major}, {"kernel_minor", cfg_.kernel_minor}});
  if (!known_advice(advice)) return SysResult::Err(EINVAL);
  uintptr_t start = reinterpret_cast<uintptr_t>(addr);
  if (start % cfg_.page_size) return SysResult::Err(EINVAL);
  uint64_t len = round_up(length, cfg_.page_size);
  if (len < length || start + len < start) return SysResult::Err(EINVAL);
  uintptr_t end = start + len;
  if (len == 0) return SysResult::Ok(0);
  if (populate_advice) {
    bool write = advice == kMadvPopulateWrite;
    return populate(start, end, write,
                    write ? "madvise(MADV_POPULATE_WRITE)" : "madvise(MADV_POPULATE_READ)", true);
  }
  // Other advice: only MADV_DONTNEED changes the model; holes give ENOMEM after the rest.
  bool hole = false;
  uintptr_t pos = start;
  auto first = vmas_.upper_bound(start);
  if (first != vmas_.begin()) --first;
  for (auto it = first; it != vmas_.end() && it->first < end; ++it) {
    SimVma& v = it->second;
    if (v.end <= start) continue;
    if (v.start > pos) hole = true;
    pos = v.end;
    if (advice != MADV_DONTNEED) continue;
    uintptr_t s = std::max(start, v.start), e = std::min(end, v.end);
    SimObject& o = *v.obj;
    if (v.hugetlb()) {
      if (!version_at_least(5, 18) || s % o.page) return SysResult::Err(EINVAL);
      // The call is valid for any length, but only whole hugepages in [s, e) are zapped:
      // madvise(a, 4096, MADV_DONTNEED) returns 0 and changes nothing (measured on 6.18).
      if (o.shared) continue;  // the page stays in the file
      uint64_t f = v.pgoff + (s - v.start) / o.page, n = (e - s) / o.page;
      for (const auto& seg : o.pages.segments(f, n)) {
        if (seg.state != PageState::Faulted) continue;
        // 6.8+ restores the reservation of a freed private page, but only while the hstate
        // has no surplus pages (a surplus page is dissolved instead). Surplus never grows here,
        // so the segment becomes [not restored...][restored...].
        const bool can_restore = version_at_least(6, 8) && !v.noreserve;
        uint64_t plain = 0, restored = 0;
        for (const auto& [nd, c] : seg.nodes) {
          uint64_t left = c;
          while (left > 0) {
            if (can_restore && o.h->surp() == 0) {
              free_huge_pages(*o.h, nd, static_cast<long>(left));
              o.h->resv += static_cast<long>(left);
              restored += left;
              left = 0;
            } else {
              long ns = o.h->node[nd].surp;
              uint64_t k = (ns > 0 && can_restore) ? std::min<uint64_t>(left, ns) : left;
              free_huge_pages(*o.h, nd, static_cast<long>(k));
              plain += k;
              left -= k;
            }
          }
          o.h->cg_usage -= std::min<uint64_t>(o.h->cg_usage, c * o.page);
        }
        o.pages.assign(seg.start, plain, PageState::None);
        o.pages.assign(seg.start + plain, restored, PageState::Reserved);
      }
    } else if (!o.shared) {
      uint64_t f = v.pgoff + (s - v.start) / o.page, n = round_up(e - s, o.page) / o.page;
      for (const auto& seg : o.pages.segments(f, n)) {
        if (seg.state != PageState::Faulted) continue;
        for (const auto& [nd, c] : seg.nodes) {
          node_mem_take(nd, -static_cast<int64_t>(c * o.page));
          memcg_usage_ -= std::min<uint64_t>(memcg_usage_, c * o.page);
        }
        o.pages.assign(seg.start, seg.len, PageState::None);
      }
    }
  }
  if (pos < end) hole = true;
  return hole ? SysResult::Err(ENOMEM) : SysResult::Ok(0);
}

SysResult SimKernel::touch(void* addr, size_t length, size_t stride) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t before = reasons_total_;
  SysResult r = do_touch(addr, length, stride);
  explain_errno("touch", r, before);
  return r;
}

SysResult SimKernel::do_touch(void* addr, size_t length, size_t stride) {
  if (crash_.signal) return SysResult::Crash(crash_.signal);
  if (stride == 0) return SysResult::Err(EINVAL);
  if (length == 0) return SysResult::Ok(0);
  const uintptr_t start = reinterpret_cast<uintptr_t>(addr);
  const uintptr_t end = start + length;
  const std::string where = "prefault touch";
  // The first touched address at or after `a`.
  auto next_point = [&](uintptr_t a) -> uintptr_t {
    if (a <= start) return start;
    return start + (a - start + stride - 1) / stride * stride;
  };
  uintptr_t pos = start;
  while (pos < end) {
    uintptr_t p = next_point(pos);
    if (p >= end) break;
    auto it = vmas_.upper_bound(p);
    if (it != vmas_.begin()) --it;
    if (it == vmas_.end() || p < it->second.start || p >= it->second.end)
      return die(SIGSEGV, where, -1, 0, "touch of an unmapped address");
    SimVma& v = it->second;
    if (!(v.prot & PROT_WRITE))
      return die(SIGSEGV, where, -1, 0, "touch of a mapping without PROT_WRITE");
    uintptr_t stop = std::min<uintptr_t>(end, v.end);
    uint64_t pg = v.obj->page;
    SimReason why;
    int node = -1;
    uint64_t hsize = 0;
    int sig = 0;
    uint64_t points = (stop - p + stride - 1) / stride;
    if (stride <= pg || points > (uint64_t{1} << 16)) {
      // Every page in between is touched (a sparse stride over a huge range is modelled as
      // dense: the same pages for stride <= page size).
      uint64_t f = v.pgoff + (p - v.start) / pg;
      uint64_t l = v.pgoff + round_up(stop - v.start, pg) / pg;
      sig = fault_range(v, f, l - f, &why, &node, &hsize);
    } else {
      for (uintptr_t q = p; q < stop && !sig; q += stride) {
        uint64_t f = v.pgoff + (q - v.start) / pg;
        sig = fault_range(v, f, 1, &why, &node, &hsize);
      }
    }
    if (sig) return die(where, node, hsize, std::move(why));
    pos = v.end;
  }
  return SysResult::Ok(0);
}

}  // namespace umbp
