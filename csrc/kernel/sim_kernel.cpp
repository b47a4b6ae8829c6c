// SimKernel state: construction from SimConfig, the hugepage pool arithmetic of
// docs/kernel-model.md sections 1-2, admin knobs and the crash record.
#include "kernel/sim_kernel.h"

#include <linux/mempolicy.h>
#include <signal.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <stdexcept>
#include <string>

#include "kernel/crash_record.h"
#include "kernel/memory_lifetimes.h"
#include "kernel/sim_rules.h"

namespace umbp {

namespace {
// One field of SimNodePool summed over the nodes.
long pool_sum(const std::map<int, SimNodePool>& node, long SimNodePool::*field) {
  long s = 0;
  for (const auto& [n, p] : node) s += p.*field;
  return s;
}
}  // namespace

long SimHState::nr() const { return pool_sum(node, &SimNodePool::nr); }
long SimHState::free() const { return pool_sum(node, &SimNodePool::free); }
long SimHState::surp() const { return pool_sum(node, &SimNodePool::surp); }

namespace {
long persistent(const SimHState& h) { return h.nr() - h.surp(); }

// Take `want` items from `nodes` in order, each limited by cap(node).
template <typename Cap>
std::vector<std::pair<int, long>> fill_in_order(long want, const std::vector<int>& nodes, Cap cap) {
  std::vector<std::pair<int, long>> out;
  for (int n : nodes) {
    if (want <= 0) break;
    long k = std::min(want, cap(n));
    if (k > 0) out.push_back({n, k});
    want -= std::max(k, 0L);
  }
  return out;
}
}  // namespace

SimKernel::SimKernel(const SimConfig& cfg) : cfg_(cfg) {
  // The numbers the description leaves to the kernel (kUnknown), derived in its node order.
  const SimHostNumbers start = derive_start(cfg_);
  cfg_.mem_free = start.mem_free;
  cfg_.mem_available = start.mem_available;
  for (size_t i = 0; i < cfg_.nodes.size(); ++i) {
    cfg_.nodes[i].mem_free = start.nodes[i].mem_free;
    cfg_.nodes[i].page_cache = start.nodes[i].page_cache;
    cfg_.nodes[i].slab_reclaimable = start.nodes[i].slab_reclaimable;
  }
  if (cfg_.possible_nodes.empty())
    for (const auto& n : cfg_.nodes) cfg_.possible_nodes.push_back(n.id);
  if (cfg_.online_nodes.empty())
    for (const auto& n : cfg_.nodes) cfg_.online_nodes.push_back(n.id);
  std::sort(cfg_.nodes.begin(), cfg_.nodes.end(),
            [](const SimNodeConfig& a, const SimNodeConfig& b) { return a.id < b.id; });
  for (const auto& n : cfg_.nodes) {
    node_free_[n.id] = static_cast<int64_t>(n.mem_free);
    node_reclaim_[n.id] = static_cast<int64_t>(n.page_cache + n.slab_reclaimable);
  }
  for (uint64_t size : cfg_.hugepage_sizes) {
    SimHState h;
    h.size = size;
    auto r = cfg_.hugepages_reserved.find(size);
    h.resv = r == cfg_.hugepages_reserved.end() ? 0 : r->second;
    auto o = cfg_.nr_overcommit_hugepages.find(size);
    h.overcommit = o == cfg_.nr_overcommit_hugepages.end() ? 0 : o->second;
    for (const auto& n : cfg_.nodes) {
      SimNodePool p;
      auto it = n.hugepages.find(size);
      if (it != n.hugepages.end()) p = {it->second.total, it->second.free, it->second.surplus};
      h.node[n.id] = p;
    }
    h.max_persistent = persistent(h);
    hstates_[size] = h;
  }
  note_simulated_memory(id());
}

SimKernel::~SimKernel() {
  real_cache_ok_ = false;  // every range really goes now (or back to the unbacked space)
  for (auto& [s, v] : vmas_) real_unmap(v.start, v.end);
  for (auto& [len, starts] : real_cache_)
    for (uintptr_t start : starts) ::munmap(reinterpret_cast<void*>(start), len);
  note_kernel_gone(id());  // handles of its buffers now point to nothing (memory_lifetimes.h)
}

size_t SimKernel::page_size() { return static_cast<size_t>(cfg_.page_size); }

SimHState* SimKernel::hstate(uint64_t size) {
  auto it = hstates_.find(size);
  return it == hstates_.end() ? nullptr : &it->second;
}

bool SimKernel::has_memory(int node) const {
  for (const auto& n : cfg_.nodes)
    if (n.id == node) return n.mem_total > 0;
  return false;
}

std::vector<int> SimKernel::memory_nodes() const {
  std::vector<int> out;
  for (const auto& n : cfg_.nodes)
    if (n.mem_total > 0) out.push_back(n.id);
  return out;
}

bool SimKernel::version_at_least(int major, int minor) const {
  return cfg_.kernel_major > major || (cfg_.kernel_major == major && cfg_.kernel_minor >= minor);
}

// Larger than the buddy allocator's largest block (MAX_PAGE_ORDER 10/11/13 for 4K/16K/64K).
bool SimKernel::gigantic(const SimHState& h) const {
  int order = cfg_.page_size >= 65536 ? 13 : cfg_.page_size >= 16384 ? 11 : 10;
  return h.size > (cfg_.page_size << order);
}

long SimKernel::pool_pages_total() const {
  long pages = 0;
  for (const auto& [size, h] : hstates_) pages += h.nr() * static_cast<long>(size / cfg_.page_size);
  return pages;
}

long SimKernel::node_mem_free(int node) const {
  auto it = node_free_.find(node);
  return it == node_free_.end() ? 0 : static_cast<long>(std::max<int64_t>(it->second, 0));
}

long SimKernel::node_obtainable(int node) const {
  auto it = node_reclaim_.find(node);
  long r = it == node_reclaim_.end() ? 0 : static_cast<long>(std::max<int64_t>(it->second, 0));
  return node_mem_free(node) + r;
}

// Reclaim up to `bytes` of the node's page cache, then its reclaimable slab (what kswapd and
// direct reclaim free before the OOM killer runs). Returns the bytes reclaimed.
int64_t SimKernel::reclaim(int node, int64_t bytes) {
  auto it = node_reclaim_.find(node);
  if (it == node_reclaim_.end() || bytes <= 0) return 0;
  int64_t k = std::min(bytes, std::max<int64_t>(it->second, 0));
  it->second -= k;
  reclaimed_ += k;
  for (const auto& n : cfg_.nodes) {
    if (n.id != node) continue;
    // Page cache goes first: what is left of this node's cache share is cache.
    int64_t cache_left = static_cast<int64_t>(n.page_cache) - node_cache_reclaimed_[node];
    int64_t c = std::min(k, std::max<int64_t>(cache_left, 0));
    node_cache_reclaimed_[node] += c;
    reclaimed_cache_ += c;
  }
  return k;
}

// Take `bytes` on a node (negative: give them back to the buddy allocator). Free memory goes
// first; what it lacks is reclaimed from the node's page cache and reclaimable slab.
void SimKernel::node_mem_take(int node, int64_t bytes) {
  if (bytes > 0) {
    int64_t from_free = std::min<int64_t>(bytes, node_mem_free(node));
    int64_t rest = bytes - from_free;
    if (rest > 0) rest -= reclaim(node, rest);
    from_free += rest;  // beyond what the node has: the counter goes negative (callers check)
    node_free_[node] -= from_free;
    mem_free_delta_ -= from_free;
    return;
  }
  node_free_[node] -= bytes;
  mem_free_delta_ -= bytes;
}

// ---- pool arithmetic --------------------------------------------------------------------

// gather_surplus_pages + the reservation: resv += delta, allocating surplus pages (which join
// the free pool at mmap time) when free - resv does not cover delta.
int SimKernel::gather_surplus(SimHState& h, long delta) {
  long needed = h.resv + delta - h.free();
  if (needed <= 0) {
    h.resv += delta;
    return 0;
  }
  long room = h.overcommit - h.surp();
  if (gigantic(h) && !version_at_least(6, 19)) room = 0;
  if (room < needed) return ENOMEM;
  // Local node first: the buddy allocator falls back in node order.
  auto plan = fill_in_order(needed, memory_nodes(),
                            [&](int n) { return node_obtainable(n) / static_cast<long>(h.size); });
  long got = 0;
  for (auto& [n, c] : plan) got += c;
  if (got < needed) return ENOMEM;
  for (auto& [n, c] : plan) {
    node_mem_take(n, static_cast<int64_t>(h.size) * c);
    h.node[n].nr += c;
    h.node[n].surp += c;
    h.node[n].free += c;
  }
  h.resv += delta;
  return 0;
}

// return_unused_surplus_pages: give back reservations, then shrink free surplus pages.
void SimKernel::return_unused_surplus(SimHState& h, long unused) {
  h.resv -= unused;
  if (h.resv < 0) h.resv = 0;
  long n = std::min(unused, h.surp());
  for (auto& [id, p] : h.node) {
    if (n <= 0) break;
    long k = std::min({n, p.free, p.surp});
    p.nr -= k;
    p.free -= k;
    p.surp -= k;
    node_mem_take(id, -static_cast<int64_t>(h.size) * k);
    n -= k;
  }
}

// free_huge_folio for `count` in-use pages of `node`: surplus pages are dissolved.
void SimKernel::free_huge_pages(SimHState& h, int node, long count) {
  SimNodePool& p = h.node[node];
  long d = std::min(count, p.surp);
  p.nr -= d;
  p.surp -= d;
  node_mem_take(node, -static_cast<int64_t>(h.size) * d);
  p.free += count - d;
}

bool SimKernel::adjust_surplus(SimHState& h, const std::vector<int>& nodes, int delta) {
  for (int n : nodes) {
    SimNodePool& p = h.node[n];
    if (delta < 0 && p.surp > 0) {
      p.surp--;
      return true;
    }
    if (delta > 0 && p.surp < p.nr) {
      p.surp++;
      return true;
    }
  }
  return false;
}

// set_max_huge_pages (mm/hugetlb.c), in bulk where the loop would be long.
int SimKernel::set_nr_hugepages(uint64_t size, long count, int node) {
  std::lock_guard<std::mutex> lock(mu_);
  SimHState* h = hstate(size);
  if (!h) return ENOENT;
  if (count < 0) return EINVAL;
  std::vector<int> allowed;
  if (node >= 0) {
    if (!h->node.count(node)) return ENOENT;
    allowed = {node};
    const SimNodePool& p = h->node[node];
    count += persistent(*h) - (p.nr - p.surp);
  } else {
    allowed = memory_nodes();
  }
  // Grow: surplus pages become persistent first, then fresh pages, interleaved.
  while (h->surp() > 0 && count > persistent(*h))
    if (!adjust_surplus(*h, allowed, -1)) break;
  if (count > persistent(*h)) {
    auto plan = rules::distribute(count - persistent(*h), allowed, [&](int n) {
      return node_obtainable(n) / static_cast<long>(h->size);
    });
    for (auto& [n, c] : plan) {
      node_mem_take(n, static_cast<int64_t>(h->size) * c);
      h->node[n].nr += c;
      h->node[n].free += c;
    }
  }
  // Shrink: free pages not needed by reservations go back; the rest become surplus.
  long min_count = std::max(count, h->resv + h->nr() - h->free());
  if (min_count < persistent(*h)) {
    auto plan = rules::distribute(persistent(*h) - min_count, allowed,
                                  [&](int n) { return h->node[n].free; });
    for (auto& [n, c] : plan) {
      h->node[n].nr -= c;
      h->node[n].free -= c;
      node_mem_take(n, -static_cast<int64_t>(h->size) * c);
    }
  }
  if (count < persistent(*h)) {
    auto plan = rules::distribute(persistent(*h) - count, allowed,
                                  [&](int n) { return h->node[n].nr - h->node[n].surp; });
    for (auto& [n, c] : plan) h->node[n].surp += c;
  }
  h->max_persistent = persistent(*h);
  return 0;
}

int SimKernel::set_nr_overcommit_hugepages(uint64_t size, long count) {
  std::lock_guard<std::mutex> lock(mu_);
  SimHState* h = hstate(size);
  if (!h) return ENOENT;
  if (count < 0) return EINVAL;
  if (gigantic(*h) && !version_at_least(6, 19)) return EINVAL;
  h->overcommit = count;
  return 0;
}

int SimKernel::set_task_policy(int mode, const std::vector<int>& nodes) {
  std::lock_guard<std::mutex> lock(mu_);
  SimPolicy p;
  p.mode = mode;
  for (int n : nodes)
    if (has_memory(n)) p.nodes.push_back(n);
  std::sort(p.nodes.begin(), p.nodes.end());
  if ((mode == MPOL_BIND || mode == MPOL_INTERLEAVE) && p.nodes.empty()) return EINVAL;
  task_policy_ = p;
  return 0;
}

// ---- objects ----------------------------------------------------------------------------

// Give back what [first, first+count) of an object holds: faulted pages to the pool (or the
// buddy allocator for base pages), reservations to the hstate.
void SimKernel::release_object_range(SimObject& o, uint64_t first, uint64_t count) {
  long unused_resv = 0;
  for (const auto& seg : o.pages.segments(first, count)) {
    if (seg.state == PageState::Reserved) unused_resv += static_cast<long>(seg.len);
    if (seg.state != PageState::Faulted) continue;
    for (const auto& [n, c] : seg.nodes) {
      if (o.h) {
        free_huge_pages(*o.h, n, static_cast<long>(c));
        o.h->cg_usage -= std::min<uint64_t>(o.h->cg_usage, c * o.h->size);
      } else {
        node_mem_take(n, -static_cast<int64_t>(c * o.page));
        memcg_usage_ -= std::min<uint64_t>(memcg_usage_, c * o.page);
      }
    }
  }
  if (o.h && unused_resv) {
    return_unused_surplus(*o.h, unused_resv);
    o.h->cg_rsvd -= std::min<uint64_t>(o.h->cg_rsvd, unused_resv * o.h->size);
  }
  o.pages.assign(first, count, PageState::None);
}

void SimKernel::drop_object_ref(const SimObjectPtr& o) {
  if (o->vma_refs > 0 || o->fd_refs > 0) return;
  // Last reference: the inode goes away with its pages and reservations.
  const uint64_t all = UINT64_MAX / 2;
  release_object_range(*o, 0, all);
}

// ---- crash and inspection ---------------------------------------------------------------

SysResult SimKernel::die(int sig, const std::string& where, int node, uint64_t hsize,
                         const std::string& detail) {
  SimReason r;
  r.rule = reason_rule(sig == SIGSEGV ? ReasonRule::segv : ReasonRule::signal).id;
  r.signal = sig;
  r.text = detail;
  return die(where, node, hsize, std::move(r));
}

SysResult SimKernel::die(const std::string& where, int node, uint64_t hsize, SimReason r) {
  r.call = where;
  crash_ = SimCrash{r.signal, where, node, hsize, r.text};
  record(std::move(r));
  return record_crash(crash_.signal, where);
}

SysResult SimKernel::fail(int err, const std::string& call, ReasonRule rule,
                          const std::string& text, SimNumbers numbers) {
  SimReason r;
  r.call = call;
  r.rule = reason_rule(rule).id;
  r.err = err;
  r.numbers = std::move(numbers);
  r.text = text;
  record(std::move(r));
  return SysResult::Err(err);
}

void SimKernel::note(const std::string& call, ReasonRule rule, const std::string& text,
                     SimNumbers numbers) {
  SimReason r;
  r.call = call;
  r.rule = reason_rule(rule).id;
  r.numbers = std::move(numbers);
  r.text = text;
  record(std::move(r));
}

// `call` a literal: no string is made for the calls that succeed (every call goes through here).
void SimKernel::explain_errno(const char* call, const SysResult& r, uint64_t before) {
  if (r.error == 0 || reasons_total_ > before) return;
  SimReason x;
  x.call = call;
  x.rule = reason_rule(ReasonRule::arguments).id;
  x.err = r.error;
  x.text = std::string(call) + " rejects these arguments on kernel " + cfg_.kernel_release;
  record(std::move(x));
}

void SimKernel::record(SimReason r) {
  // A reason carries the numbers its rule declares: explanations and fixes read them by name.
  if (std::string problem = reason_numbers_problem(r.rule, r.numbers); !problem.empty())
    throw std::logic_error("SimKernel: " + problem);
  if (reasons_.size() >= kMaxReasons)
    reasons_.erase(reasons_.begin(), reasons_.begin() + kMaxReasons / 2);
  reasons_.push_back(std::move(r));
  ++reasons_total_;
}

std::vector<SimReason> SimKernel::reasons() {
  std::lock_guard<std::mutex> lock(mu_);
  return reasons_;
}

void SimKernel::clear_reasons() {
  std::lock_guard<std::mutex> lock(mu_);
  reasons_.clear();
}

uint64_t SimKernel::node_reclaimable(int node) {
  std::lock_guard<std::mutex> lock(mu_);
  if (node >= 0) {
    auto it = node_reclaim_.find(node);
    return it == node_reclaim_.end() ? 0 : static_cast<uint64_t>(std::max<int64_t>(it->second, 0));
  }
  uint64_t s = 0;
  for (const auto& [n, v] : node_reclaim_) s += static_cast<uint64_t>(std::max<int64_t>(v, 0));
  return s;
}

bool SimKernel::dead() {
  std::lock_guard<std::mutex> lock(mu_);
  return crash_.signal != 0;
}

SimCrash SimKernel::crash() {
  std::lock_guard<std::mutex> lock(mu_);
  return crash_;
}

std::vector<SimMappingInfo> SimKernel::mappings() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SimMappingInfo> out;
  for (const auto& [s, v] : vmas_) {
    SimMappingInfo m;
    m.start = v.start;
    m.length = v.len();
    m.prot = v.prot;
    m.flags = v.flags;
    m.page_size = v.obj->page;
    m.hugetlb = v.hugetlb();
    m.shared = v.obj->shared;
    m.policy_mode = v.policy.mode;
    m.policy_nodes = v.policy.nodes;
    uint64_t n = v.len() / v.obj->page;
    m.faulted_pages = v.obj->pages.count(v.pgoff, n, PageState::Faulted);
    m.reserved_pages = v.obj->pages.count(v.pgoff, n, PageState::Reserved);
    if (v.obj->is_file) {
      m.file_size = static_cast<int64_t>(v.obj->i_size);
      for (const auto& [fd, e] : fds_) {
        if (e.obj != v.obj) continue;
        m.file_fds.push_back(fd);
        m.file_fds_cloexec += e.cloexec;
      }
    }
    out.push_back(m);
  }
  return out;
}

std::vector<int> SimKernel::open_fds() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> out;
  for (const auto& [fd, o] : fds_) out.push_back(fd);
  return out;
}

std::vector<long> SimKernel::hugepage_counters(uint64_t size, int node) {
  std::lock_guard<std::mutex> lock(mu_);
  SimHState* h = hstate(size);
  if (!h) return {};
  SimPoolCounters c;
  if (node < 0) {
    c.total = h->nr();
    c.free = h->free();
    c.reserved = h->resv;
    c.surplus = h->surp();
    return c.in_order();
  }
  auto it = h->node.find(node);
  if (it == h->node.end()) return {};
  c.total = it->second.nr;
  c.free = it->second.free;
  c.surplus = it->second.surp;  // reserved: the kernel keeps none per node
  return c.in_order();
}

uint64_t SimKernel::committed_as() {
  std::lock_guard<std::mutex> lock(mu_);
  return cfg_.committed_as + committed_;
}

uint64_t SimKernel::total_vm() {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t vm = cfg_.base_vm;
  for (const auto& [s, v] : vmas_) vm += v.len();
  return vm;
}

uint64_t SimKernel::commit_limit() {
  std::lock_guard<std::mutex> lock(mu_);
  return commit_limit_locked();
}

// vm_commit_limit (mm/util.c), in bytes: the pools as they are now.
uint64_t SimKernel::commit_limit_locked() const {
  return rules::commit_limit(cfg_.mem_total, static_cast<uint64_t>(pool_pages_total()),
                             cfg_.page_size, cfg_.overcommit_ratio, cfg_.overcommit_kbytes,
                             cfg_.swap_total);
}

int64_t SimKernel::mem_free_now_locked() const {
  return std::max<int64_t>(0, static_cast<int64_t>(cfg_.mem_free) + mem_free_delta_);
}

// Memory taken since start came from MemFree or from reclaimed cache: either way it is no
// longer available.
int64_t SimKernel::mem_available_now_locked() const {
  return std::max<int64_t>(0,
                           static_cast<int64_t>(cfg_.mem_available) + mem_free_delta_ - reclaimed_);
}

// A node's MemFree, page cache and reclaimable slab now: reclaim takes the cache first.
SimNodeNumbers SimKernel::node_numbers_locked(const SimNodeConfig& n) const {
  auto gone = node_cache_reclaimed_.find(n.id);
  const uint64_t cache_gone =
      gone == node_cache_reclaimed_.end() ? 0 : static_cast<uint64_t>(gone->second);
  const uint64_t cache = n.page_cache - std::min<uint64_t>(n.page_cache, cache_gone);
  auto r = node_reclaim_.find(n.id);
  const uint64_t reclaim =
      r == node_reclaim_.end() ? 0 : static_cast<uint64_t>(std::max<int64_t>(r->second, 0));
  return {n.id, static_cast<uint64_t>(node_mem_free(n.id)), cache,
          reclaim > cache ? reclaim - cache : 0};
}

SimHostNumbers SimKernel::numbers() {
  std::lock_guard<std::mutex> lock(mu_);
  SimHostNumbers out;
  out.mem_free = static_cast<uint64_t>(mem_free_now_locked());
  out.mem_available = static_cast<uint64_t>(mem_available_now_locked());
  out.commit_limit = commit_limit_locked();
  for (const auto& n : cfg_.nodes) out.nodes.push_back(node_numbers_locked(n));
  return out;
}

}  // namespace umbp
