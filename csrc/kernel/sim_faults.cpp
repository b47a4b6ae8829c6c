// SimKernel: the fault path: which node a fault takes a page from, populate, madvise and touch
// (docs/kernel-model.md sections 1-4, 6). Faults are accounting only: real memory behind a
// mapping is never touched here.
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

// Nodes a fault may take a page from, in the order it tries them (local = lowest node with
// memory first). INTERLEAVE is spread over its nodes by fault_range.
NodeList SimKernel::fault_order(const SimPolicy& vp, uint64_t) const {
  const SimPolicy& p = (vp.mode == MPOL_DEFAULT) ? task_policy_ : vp;
  if (p.mode == MPOL_BIND) return NodeList(p.nodes.begin(), p.nodes.end());
  const bool preferred =
      p.mode == MPOL_PREFERRED || p.mode == MPOL_INTERLEAVE || p.mode == 5 /*PREFERRED_MANY*/;
  NodeList out;
  if (preferred) out = NodeList(p.nodes.begin(), p.nodes.end());
  for (const auto& n : cfg_.nodes) {  // memory_nodes(), without a vector made per fault
    if (n.mem_total > 0 && (!preferred || std::find(out.begin(), out.end(), n.id) == out.end()))
      out.push_back(n.id);
  }
  return out;
}

int SimKernel::fault_range(SimVma& v, uint64_t first, uint64_t count, SimReason* why, int* node,
                           uint64_t* hsize) {
  SimObject& o = *v.obj;
  SimFault f{v, o, o.h, v.policy.mode == MPOL_DEFAULT ? task_policy_ : v.policy,
             fault_order(v.policy, first)};
  *node = f.order.empty() ? -1 : f.order.front();
  *hsize = f.h ? f.h->size : 0;
  uint64_t limit = count;
  bool beyond_eof = false;
  if (o.is_file) {
    // The page that holds the end of the file is the file's (the rest of it reads as zeros);
    // a page wholly past the end is SIGBUS (mm/shmem.c shmem_get_folio_gfp: index << PAGE_SHIFT
    // >= i_size). A hugetlbfs file's size is a multiple of its page size (ftruncate refuses
    // others), so this is its rule too.
    const uint64_t eof = file_pages(o);
    if (first + count > eof) {
      limit = eof > first ? eof - first : 0;
      beyond_eof = true;
    }
  }
  // The mapping's pages (up to the end of a memfd) and, from its first fault on, what the
  // allowed nodes held then: the numbers a failure is explained with (SimFaultBase).
  f.vfirst = v.pgoff;
  f.vcount = v.len() / o.page;
  if (o.is_file)
    f.vcount = std::min(f.vcount, file_pages(o) > f.vfirst ? file_pages(o) - f.vfirst : 0);
  take_fault_base(f);
  for (const auto& seg : o.pages.segments(first, limit)) {
    if (seg.state == PageState::Faulted) continue;
    const int sig = f.h ? fault_hugetlb(f, seg, why) : fault_base_pages(f, seg, why);
    if (sig == SIGKILL) *hsize = 0;
    if (sig) return sig;
  }
  if (beyond_eof) {
    why->signal = SIGBUS;
    why->rule = reason_rule(ReasonRule::memfd_beyond_eof).id;
    why->numbers = {{"file_size", i64(o.i_size)}};
    why->text = "fault beyond the end of the memfd (" + std::to_string(o.i_size) + " bytes)";
    return SIGBUS;
  }
  return 0;
}

// The mapping's fault base: kept while the VMA and the node order are the ones it was taken
// for, else taken now.
void SimKernel::take_fault_base(SimFault& f) {
  SimFaultBase& base = f.v.fault_base;
  if (base.start == f.v.start && base.end == f.v.end && base.order == f.order) return;
  base = SimFaultBase{};
  base.start = f.v.start;
  base.end = f.v.end;
  base.order = f.order;
  base.faulted = f.o.pages.count(f.vfirst, f.vcount, PageState::Faulted);
  base.unfaulted = f.vcount - base.faulted;
  for (int n : f.order) {
    if (f.h) base.nodes_free += f.h->node[n].free;
    base.mem_free += node_mem_free(n);
    auto r = node_reclaim_.find(n);
    if (r != node_reclaim_.end()) base.reclaim += std::max<int64_t>(r->second, 0);
  }
  base.hfree = f.h ? f.h->free() : 0;
  base.hresv = f.h ? f.h->resv : 0;
  base.hsurp = f.h ? f.h->surp() : 0;
}

// Pages of the mapping faulted since its base, once this fault is done.
int64_t SimKernel::faulted_since_base(const SimFault& f) const {
  return static_cast<int64_t>(f.o.pages.count(f.vfirst, f.vcount, PageState::Faulted)) -
         static_cast<int64_t>(f.v.fault_base.faulted);
}

// Which nodes give up to `cap` free hugepages: an INTERLEAVE policy spreads them over its nodes
// and then falls back in order; any other policy takes them in fallback order.
std::vector<std::pair<int, long>> SimKernel::free_page_plan(const SimFault& f, long cap) const {
  std::vector<std::pair<int, long>> take;
  SimHState& h = *f.h;
  if (f.pol.mode != MPOL_INTERLEAVE) {
    long left = cap;
    for (int n : f.order) {
      long k = std::min(left, h.node[n].free);
      if (k > 0) take.push_back({n, k});
      left -= std::max(k, 0L);
    }
    return take;
  }
  std::map<int, long> share;
  long left = cap;
  // Spread over the interleave nodes, then fall back in order.
  while (left > 0) {
    long given = 0;
    std::vector<int> live;
    for (int n : f.pol.nodes)
      if (h.node[n].free - share[n] > 0) live.push_back(n);
    if (live.empty()) break;
    long each = std::max(1L, left / static_cast<long>(live.size()));
    for (int n : live) {
      long k = std::min({each, left - given, h.node[n].free - share[n]});
      share[n] += k;
      given += k;
    }
    left -= given;
    if (!given) break;
  }
  for (int n : f.order) {
    long k = std::min(left, h.node[n].free - share[n]);
    if (k > 0) {
      share[n] += k;
      left -= k;
    }
  }
  for (int n : f.order)
    if (share[n] > 0) take.push_back({n, share[n]});
  return take;
}

// Surplus pages from the buddy allocator on the fault's nodes, within nr_overcommit_hugepages,
// until `have` reaches `need`. Returns the new `have`.
long SimKernel::fault_surplus(SimFault& f, long need, long have, NodeCounts& got) {
  SimHState& h = *f.h;
  while (have < need) {
    long room = h.overcommit - h.surp();
    if (room <= 0 || (gigantic(h) && !version_at_least(6, 19))) break;
    long before = have;
    for (int n : f.order) {
      long k = std::min({need - have, room, node_obtainable(n) / static_cast<long>(h.size)});
      if (k <= 0 || !has_memory(n)) continue;
      node_mem_take(n, static_cast<int64_t>(h.size) * k);
      h.node[n].nr += k;
      h.node[n].surp += k;
      got.push_back({n, static_cast<uint64_t>(k)});
      have += k;
      room -= k;
    }
    if (have == before) break;
  }
  return have;
}

// A segment of hugepages: within the hugetlb cgroup limit, free pages on the allowed nodes
// (an unreserved fault also needs free - resv >= 1), then surplus pages. 0 or SIGBUS.
int SimKernel::fault_hugetlb(SimFault& f, const PageSegment& seg, SimReason* why) {
  SimHState& h = *f.h;
  long need = static_cast<long>(seg.len);
  auto cm = cfg_.hugetlb_cgroup_max.find(h.size);
  bool cg_limited = false;
  if (cm != cfg_.hugetlb_cgroup_max.end()) {
    long room = static_cast<long>((cm->second > h.cg_usage ? cm->second - h.cg_usage : 0) / h.size);
    if (room < need) {
      need = room;
      cg_limited = true;
    }
  }
  long cap = need;
  if (seg.state == PageState::None) cap = std::min(cap, std::max(0L, h.free() - h.resv));
  NodeCounts got;
  long have = 0;
  for (auto& [n, k] : free_page_plan(f, cap)) {
    h.node[n].free -= k;
    got.push_back({n, static_cast<uint64_t>(k)});
    have += k;
  }
  have = fault_surplus(f, need, have, got);
  if (seg.state == PageState::Reserved) {
    h.resv -= have;
    h.cg_rsvd -= std::min<uint64_t>(h.cg_rsvd, static_cast<uint64_t>(have) * h.size);
  }
  h.cg_usage += static_cast<uint64_t>(have) * h.size;
  f.o.pages.assign(seg.start, static_cast<uint64_t>(have), PageState::Faulted, got);
  if (have >= static_cast<long>(seg.len)) return 0;
  const SimFaultBase& base = f.v.fault_base;
  why->signal = SIGBUS;
  why->numbers = {{"hugepage_size", i64(h.size)},
                  {"node", f.order.empty() ? -1 : f.order.front()},
                  {"pages_needed", static_cast<int64_t>(base.unfaulted)},
                  {"pages_faulted", faulted_since_base(f)},
                  {"node_free", base.nodes_free},
                  {"free", base.hfree},
                  {"reserved", base.hresv},
                  {"surplus", base.hsurp},
                  {"surplus_allowed", h.overcommit}};
  if (cg_limited && have == need) {
    why->rule = reason_rule(ReasonRule::hugetlb_cgroup_limit).id;
    why->numbers.push_back({"limit", i64(cm->second)});
    why->text = "hugetlb cgroup limit " + kb(cm->second) + " reached";
  } else {
    why->rule = reason_rule(ReasonRule::hugetlb_fault_no_page).id;
    why->text = "no free " + kb(h.size) + " hugepage on node(s) " + node_list(f.order) +
                " (HugePages_Free=" + std::to_string(h.free()) + " Rsvd=" + std::to_string(h.resv) +
                " Surp=" + std::to_string(h.surp()) +
                " nr_overcommit=" + std::to_string(h.overcommit) + ")";
  }
  return SIGBUS;
}

// A segment of base pages: charged to the memory cgroup, taken from the allowed nodes' free
// memory (in fallback order), then by reclaim: page cache and reclaimable slab go before the
// OOM killer is called. 0 or SIGKILL.
int SimKernel::fault_base_pages(SimFault& f, const PageSegment& seg, SimReason* why) {
  const uint64_t pg = f.o.page;
  long need = static_cast<long>(seg.len);
  bool memcg_limited = false;
  if (cfg_.memcg_max != UINT64_MAX) {
    long room =
        static_cast<long>((cfg_.memcg_max > memcg_usage_ ? cfg_.memcg_max - memcg_usage_ : 0) / pg);
    if (room < need) {
      need = room;
      memcg_limited = true;
    }
  }
  NodeCounts by_node;  // pages taken per node (a few nodes: a list, not a map)
  auto taken = [&by_node](int n) -> uint64_t* {
    for (auto& [node, c] : by_node)
      if (node == n) return &c;
    return nullptr;
  };
  long have = 0;
  for (int pass = 0; pass < 2 && have < need; ++pass) {
    for (int n : f.order) {
      long cap = pass == 0 ? node_mem_free(n) : node_obtainable(n);
      long k = std::min(need - have, cap / static_cast<long>(pg));
      if (k <= 0) continue;
      node_mem_take(n, static_cast<int64_t>(pg) * k);
      if (uint64_t* c = taken(n))
        *c += static_cast<uint64_t>(k);
      else
        by_node.push_back({n, static_cast<uint64_t>(k)});
      have += k;
    }
  }
  NodeCounts got;
  for (int n : f.order)
    if (const uint64_t* c = taken(n); c && *c) got.push_back({n, *c});
  memcg_usage_ += static_cast<uint64_t>(have) * pg;
  f.o.pages.assign(seg.start, static_cast<uint64_t>(have), PageState::Faulted, got);
  if (have >= static_cast<long>(seg.len)) return 0;
  const SimFaultBase& base = f.v.fault_base;
  why->signal = SIGKILL;
  why->numbers = {{"node", f.order.empty() ? -1 : f.order.front()},
                  {"node_count", static_cast<int64_t>(f.order.size())},
                  {"bytes_needed", static_cast<int64_t>(base.unfaulted * pg)},
                  {"bytes_faulted", faulted_since_base(f) * i64(pg)},
                  {"node_free", base.mem_free},
                  {"reclaimable", base.reclaim}};
  if (memcg_limited) {
    why->rule = reason_rule(ReasonRule::memcg_oom).id;
    why->numbers.push_back({"limit", i64(cfg_.memcg_max)});
    why->text = "memory cgroup limit " + kb(cfg_.memcg_max) + " reached: OOM kill";
  } else {
    why->rule = reason_rule(ReasonRule::oom).id;
    why->text = "out of memory on node(s) " + node_list(f.order) + ": OOM kill";
  }
  return SIGKILL;
}

// Fault every page of [start, end): MADV_POPULATE_* (is_madvise) or MAP_POPULATE.
SysResult SimKernel::populate(uintptr_t start, uintptr_t end, bool write, const char* where,
                              bool is_madvise) {
  uintptr_t pos = start;
  while (pos < end) {
    auto it = vmas_.upper_bound(pos);
    if (it == vmas_.begin()) return SysResult::Err(ENOMEM);
    --it;
    SimVma& v = it->second;
    if (pos >= v.end) return SysResult::Err(ENOMEM);
    if (v.prot == PROT_NONE || (write && !(v.prot & PROT_WRITE))) return SysResult::Err(EINVAL);
    if (!write && !v.hugetlb() && !v.obj->shared && !v.obj->is_file) {
      // A read fault of private anonymous memory maps the shared zero page: nothing is
      // allocated until a write (mm/memory.c do_anonymous_page). Hugetlb has no zero page, and
      // shmem allocates on a read fault too (docs/kernel-model.md section 4).
      pos = v.end;
      continue;
    }
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
      why.text += std::string(": ") + where + " returns EFAULT";
      record(std::move(why));
      return SysResult::Err(EFAULT);
    }
    pos = v.end;
  }
  return SysResult::Ok(0);
}

SysResult SimKernel::madvise(void* addr, size_t length, int advice) {
  return syscall(SysOp::madvise, advice, [&] { return do_madvise(addr, length, advice); });
}

SysResult SimKernel::do_madvise(void* addr, size_t length, int advice) {
  const bool populate_advice = advice == kMadvPopulateRead || advice == kMadvPopulateWrite;
  if (populate_advice && !version_at_least(5, 14))
    return fail(EINVAL,
                advice == kMadvPopulateWrite ? "madvise(MADV_POPULATE_WRITE)"
                                             : "madvise(MADV_POPULATE_READ)",
                ReasonRule::populate_unsupported,
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
        v.fault_base = SimFaultBase{};  // pages freed: the next fault counts from what is left
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
        v.fault_base = SimFaultBase{};
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
  return syscall(SysOp::touch, [&] { return do_touch(addr, length, stride); });
}

SysResult SimKernel::do_touch(void* addr, size_t length, size_t stride) {
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
