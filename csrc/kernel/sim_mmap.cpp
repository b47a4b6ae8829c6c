// SimKernel: mmap and munmap: overcommit accounting, VMAs
// (docs/kernel-model.md sections 1, 2, 6).
// Faults are in sim_faults.cpp, the real address space in sim_address_space.cpp.
#include <linux/mempolicy.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "kernel/crash_record.h"
#include "kernel/sim_kernel.h"
#include "kernel/sim_mm_util.h"

namespace umbp {

using namespace sim_mm;  // NOLINT(build/namespaces)

// __vm_enough_memory: 0 or ENOMEM; charges Committed_AS on success.
int SimKernel::commit_check(uint64_t bytes, uint64_t /*new_vm_bytes*/) {
  const uint64_t ps = cfg_.page_size;
  const uint64_t pages = bytes / ps;
  if (cfg_.overcommit_memory == 0) {
    if (pages > cfg_.mem_total / ps + cfg_.swap_total / ps) {
      fail(ENOMEM, "mmap", ReasonRule::overcommit_heuristic,
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
      fail(ENOMEM, "mmap", ReasonRule::commit_limit,
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
    SimVma v = std::move(it->second);  // erased next: no copy of its policy and fault base
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
  return syscall(SysOp::mmap, [&] { return do_mmap(addr, length, prot, flags, fd, offset); });
}

SysResult SimKernel::do_mmap(void* addr, size_t length, int prot, int flags, int fd, off_t offset) {
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
  SysResult backing = mmap_backing(flags, fd, anon, &file, &h);
  if (!backing.ok()) return backing;
  if (length == 0) return SysResult::Err(EINVAL);
  const uint64_t unit = h ? h->size : ps;
  uint64_t len = round_up(length, unit);
  if (len < length || len > (uint64_t{1} << 62)) return SysResult::Err(ENOMEM);
  if (h && static_cast<uint64_t>(offset) % h->size) return SysResult::Err(EINVAL);
  if (fixed && hint % unit) return SysResult::Err(EINVAL);
  SysResult room = mmap_make_room(hint, len, fixed, flags);
  if (!room.ok()) return room;

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
    SysResult r = reserve_hugepages(*h, delta);
    if (!r.ok()) {
      if (accounted) committed_ -= len;
      return r;
    }
  }

  uintptr_t start = 0;
  bool real_rw = true;
  int err = reserve_real(hint, len, std::max<uint64_t>(unit, 4096), fixed, &start, &real_rw);
  if (err) {
    if (delta > 0) return_unused_surplus(*h, delta);
    if (accounted) committed_ -= len;
    return fail(err, "mmap", ReasonRule::address_space,
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
  v.real_rw = real_rw;
  obj->vma_refs++;
  vmas_.emplace(start, std::move(v));

  if (flags & MAP_POPULATE) {
    // MAP_POPULATE hides fault failures (section 1); an OOM kill is still a kill.
    SysResult r = populate(start, start + len, writable, "mmap(MAP_POPULATE)", false);
    if (r.signal == SIGKILL) return r;
    crash_ = SimCrash{};
  }
  return SysResult::Ok(static_cast<long>(start));
}

// What the mapping is of: a memfd (`fd`, its hstate if on hugetlbfs) or anonymous memory, and
// for MAP_HUGETLB the hstate its flags name. Ok(0) or the errno.
SysResult SimKernel::mmap_backing(int flags, int fd, bool anon, SimObjectPtr* file, SimHState** h) {
  if (!anon) {
    auto it = fds_.find(fd);
    if (it == fds_.end()) return SysResult::Err(EBADF);
    *file = it->second.obj;
    if ((*file)->h)
      *h = (*file)->h;
    else if (flags & MAP_HUGETLB)
      return SysResult::Err(EINVAL);
    return SysResult::Ok(0);
  }
  if (!(flags & MAP_HUGETLB)) return SysResult::Ok(0);
  // Size field: log2 of the hugepage size in bits 26..31 (ignored before 3.8); 0 = default.
  int log = (flags >> kMapHugeShift) & kMapHugeMask;
  if (!version_at_least(3, 8)) log = 0;
  uint64_t size = log ? (uint64_t{1} << log) : cfg_.default_hugepage_size;
  *h = size ? hstate(size) : nullptr;
  if (*h) return SysResult::Ok(0);
  std::string sizes;
  for (uint64_t z : cfg_.hugepage_sizes) sizes += (sizes.empty() ? "" : ", ") + kb(z);
  return fail(EINVAL, "mmap", ReasonRule::hugepage_size_unknown,
              "this kernel has no " + kb(size) +
                  " hugepages (sizes: " + (sizes.empty() ? std::string("none") : sizes) +
                  "): mmap(MAP_HUGETLB) fails with EINVAL",
              {{"hugepage_size", i64(size)}});
}

// MAP_FIXED replaces what is there (the model only replaces its own mappings); then the
// simulated address space must hold `len` more bytes: TASK_SIZE and RLIMIT_AS. Ok(0) or ENOMEM.
SysResult SimKernel::mmap_make_room(uintptr_t hint, uint64_t len, bool fixed, int flags) {
  if (fixed && (flags & MAP_FIXED)) {
    SysResult r = munmap_locked(hint, hint + len);
    if (!r.ok()) return r;
  }
  // get_unmapped_area: the simulated process's address space (TASK_SIZE) must hold it (the
  // model adds sizes: no fragmentation, no stack gap). Never the analyst's own address space,
  // which only decides where the simulated mapping really lives (sim_address_space.cpp).
  uint64_t vm = cfg_.base_vm;
  for (const auto& [s, v] : vmas_) vm += v.len();
  if (!fixed && (vm > cfg_.task_size || len > cfg_.task_size - vm))
    return fail(ENOMEM, "mmap", ReasonRule::address_space,
                "no room for " + str(i64(len)) +
                    " bytes in the address space: the simulated process's user address space "
                    "(TASK_SIZE) is " +
                    str(i64(cfg_.task_size)) + " bytes, it maps " + str(i64(vm)) +
                    " and asks for " + str(i64(len)) + " more",
                {{"length", i64(len)}, {"vm", i64(vm)}, {"task_size", i64(cfg_.task_size)}});
  // RLIMIT_AS counts every VMA, hugetlb and NORESERVE included.
  if (cfg_.rlimit_as != UINT64_MAX && vm + len > cfg_.rlimit_as)
    return fail(ENOMEM, "mmap", ReasonRule::rlimit_as,
                "RLIMIT_AS (Max address space) is " + str(i64(cfg_.rlimit_as)) +
                    " bytes: the process maps " + str(i64(vm)) + " and asks for " + str(i64(len)) +
                    " more",
                {{"vm", i64(vm)}, {"length", i64(len)}, {"limit", i64(cfg_.rlimit_as)}});
  return SysResult::Ok(0);
}

// Reserve `delta` hugepages of `h` at mmap time (docs/kernel-model.md section 1 steps 1-3):
// the hugetlb cgroup's reservation limit, free - resv or surplus pages, then the task's
// MPOL_BIND nodes. Ok(0) with resv += delta, or ENOMEM with nothing changed.
SysResult SimKernel::reserve_hugepages(SimHState& h, long delta) {
  auto rm = cfg_.hugetlb_cgroup_rsvd_max.find(h.size);
  if (rm != cfg_.hugetlb_cgroup_rsvd_max.end() && version_at_least(5, 7) &&
      h.cg_rsvd + static_cast<uint64_t>(delta) * h.size > rm->second)
    return fail(
        ENOMEM, "mmap", ReasonRule::hugetlb_cgroup_rsvd,
        "the hugetlb cgroup reservation limit for " + kb(h.size) + " pages is " +
            str(i64(rm->second)) + " bytes; " + str(delta) + " pages more do not fit",
        {{"hugepage_size", i64(h.size)}, {"pages_needed", delta}, {"limit", i64(rm->second)}});
  const long free0 = h.free(), resv0 = h.resv, surp0 = h.surp();
  const long short0 = std::max(0L, resv0 + delta - free0);
  SimNumbers pool = {{"hugepage_size", i64(h.size)},
                     {"pages_needed", delta},
                     {"free", free0},
                     {"reserved", resv0},
                     {"available", free0 - resv0},
                     {"surplus", surp0},
                     {"surplus_allowed", h.overcommit}};
  if (delta > 0 && gather_surplus(h, delta))
    return hugetlb_reserve_failed(h, delta, free0, resv0, surp0, pool);
  if (delta > 0 && short0 > 0) {
    note("mmap", ReasonRule::hugetlb_surplus_gathered,
         "mmap(MAP_HUGETLB) reserves " + str(delta) + " " + kb(h.size) +
             " pages: " + str(free0 - resv0) + " available in the pool, and the " + str(short0) +
             " missing were allocated as surplus pages (nr_overcommit_hugepages " +
             str(h.overcommit) + ", surplus now " + str(h.surp()) + ")",
         pool);
  } else if (delta > 0) {
    note("mmap", ReasonRule::hugetlb_reserved,
         "mmap(MAP_HUGETLB) reserves " + str(delta) + " " + kb(h.size) +
             " pages from the global pool (HugePages_Free " + str(free0) + " - Rsvd " + str(resv0) +
             " = " + str(free0 - resv0) +
             " available); which node gives them is decided at fault time",
         pool);
  }
  if (delta > 0 && version_at_least(5, 9) && task_policy_.mode == MPOL_BIND) {
    long allowed = 0;
    for (int n : task_policy_.nodes) allowed += h.node[n].free;
    if (delta > allowed) {
      return_unused_surplus(h, delta);
      return fail(ENOMEM, "mmap", ReasonRule::hugetlb_reserve_mpol_bind,
                  "the task's MPOL_BIND nodes have " + str(allowed) + " free " + kb(h.size) +
                      " pages, " + str(delta) + " needed (5.9+ checks them at mmap)",
                  {{"hugepage_size", i64(h.size)}, {"pages_needed", delta}, {"free", allowed}});
    }
  }
  return SysResult::Ok(0);
}

// Why the pool (free0, resv0, surp0 before: `pool`) could not back a reservation of `delta` pages:
// nr_overcommit_hugepages leaves too little room for surplus pages, or the buddy allocator has
// too few free blocks for them. ENOMEM.
SysResult SimKernel::hugetlb_reserve_failed(const SimHState& h, long delta, long free0, long resv0,
                                            long surp0, SimNumbers pool) {
  const long short0 = std::max(0L, resv0 + delta - free0);
  long room0 = h.overcommit - surp0;
  if (gigantic(h) && !version_at_least(6, 19)) room0 = 0;
  std::string base = "mmap(MAP_HUGETLB) reserves all " + str(delta) + " " + kb(h.size) +
                     " pages at mmap time: HugePages_Free " + str(free0) + " - Rsvd " + str(resv0) +
                     " = " + str(free0 - resv0) + " available, " + str(short0) + " short";
  if (room0 < short0) {
    return fail(ENOMEM, "mmap", ReasonRule::hugetlb_reserve,
                base + "; nr_overcommit_hugepages " + str(h.overcommit) + " with " + str(surp0) +
                    " surplus in use allows " + str(std::max(0L, room0)) + " more: ENOMEM",
                pool);
  }
  long obtainable = 0;
  for (int n : memory_nodes()) obtainable += node_obtainable(n) / static_cast<long>(h.size);
  pool.push_back({"surplus_obtainable", obtainable});
  return fail(ENOMEM, "mmap", ReasonRule::hugetlb_surplus_no_memory,
              base + "; nr_overcommit_hugepages allows them as surplus pages, but the " +
                  "buddy allocator has only " + str(obtainable) + " free " + kb(h.size) +
                  " blocks: ENOMEM",
              pool);
}

SysResult SimKernel::munmap(void* addr, size_t length) {
  return syscall(SysOp::munmap, [&] { return do_munmap(addr, length); });
}

SysResult SimKernel::do_munmap(void* addr, size_t length) {
  uintptr_t start = reinterpret_cast<uintptr_t>(addr);
  if (start % cfg_.page_size || length == 0) return SysResult::Err(EINVAL);
  uint64_t len = round_up(length, cfg_.page_size);
  if (len < length || start + len < start) return SysResult::Err(EINVAL);
  return munmap_locked(start, start + len);
}

}  // namespace umbp
