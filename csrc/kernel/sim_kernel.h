// SimKernel: a model of the Linux memory subsystem (docs/kernel-model.md) behind the Kernel
// seam. Everything is counters and interval runs, so a 4 TiB mapping costs as much as 4 KiB.
//
// Layout of the implementation:
//   sim_config.h   the starting description (from umbp_sim.machine.Machine)
//   sim_pages.h    PageRuns: per-page state of a mapping's backing object, as interval runs
//   small_vec.h    SmallVec: the per-call lists (node counts, node order, segments) inline
//   sim_rules.h    Linux's arithmetic (MemAvailable, CommitLimit, watermarks, round robin) and
//                  the starting numbers derived from the config's raw facts
//   sim_kernel.cpp state, hugepage pool arithmetic, admin knobs, crash bookkeeping
//   sim_mmap.cpp   mmap, munmap: overcommit accounting, VMAs
//   sim_faults.cpp the fault path: fault_order, fault_range, populate, madvise, touch
//   sim_address_space.cpp  the real address space reserved behind simulated mappings
//   sim_mm_util.h  small helpers of those three files
//   sim_mbind.cpp  mbind
//   sim_memfd.cpp  memfd_create, ftruncate, close
//   sim_render.cpp /proc and /sys rendering, read_file
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kernel/crash_record.h"
#include "kernel/kernel.h"
#include "kernel/reason_rules.h"
#include "kernel/sim_config.h"
#include "kernel/sim_pages.h"
#include "kernel/sim_rules.h"
#include "kernel/small_vec.h"
#include "kernel/syscall_format.h"

namespace umbp {

// Per-node share of one hugepage size.
struct SimNodePool {
  long nr = 0;
  long free = 0;
  long surp = 0;
};

// One hstate (hugepage size), docs/kernel-model.md section 0.
struct SimHState {
  uint64_t size = 0;
  long resv = 0;
  long overcommit = 0;
  long max_persistent = 0;  // /proc/sys/vm/nr_hugepages (max_huge_pages)
  std::map<int, SimNodePool> node;
  uint64_t cg_usage = 0;  // bytes faulted by the simulated process (hugetlb cgroup)
  uint64_t cg_rsvd = 0;   // bytes reserved by the simulated process (hugetlb cgroup rsvd)

  long nr() const;
  long free() const;
  long surp() const;
};

// A memory policy (VMA or task).
struct SimPolicy {
  int mode = 0;            // MPOL_DEFAULT
  std::vector<int> nodes;  // sorted, only nodes with memory
  bool operator==(const SimPolicy& o) const { return mode == o.mode && nodes == o.nodes; }
};

// What a mapping's pages belong to: a private mapping's own object, a memfd inode, or the
// anonymous inode of a MAP_SHARED|MAP_ANONYMOUS mapping.
struct SimObject {
  uint64_t page = 0;       // page size of the object (a hugepage size, or the base page size)
  SimHState* h = nullptr;  // hugetlb hstate, or nullptr for base pages
  bool shared = false;
  PageRuns pages;        // index in `page` units from the object start
  uint64_t i_size = 0;   // file size (memfd); private/anon objects: unused
  bool is_file = false;  // memfd inode: pages beyond i_size SIGBUS
  int fd_refs = 0;       // open simulated fds
  int vma_refs = 0;      // VMAs mapping it
  std::string name;
};
using SimObjectPtr = std::shared_ptr<SimObject>;

// An entry of the simulated fd table: the file it opens and its close-on-exec flag (a property
// of the descriptor, not of the file: MFD_CLOEXEC at memfd_create sets it).
struct SimFd {
  SimObjectPtr obj;
  bool cloexec = false;
};

// The pages of a file object that are the file's: those that hold any of its i_size bytes.
inline uint64_t file_pages(const SimObject& o) {
  return o.i_size / o.page + (o.i_size % o.page != 0);
}

// What the nodes held when a mapping faulted for the first time. A failure later in the mapping
// is explained with these numbers and the mapping's pages, so an allocator that touches page by
// page (one fault each, as mori's manual prefault through the interposer) reads as one populate
// of the whole buffer would, not as "1 page needed, 0 free" after the first pages took the rest.
// Nodes in fallback order (a fault's): inline, as hosts have a few nodes.
using NodeList = SmallVec<int, 4>;

struct SimFaultBase {
  uintptr_t start = 0, end = 0;  // the VMA taken for (split, new policy, DONTNEED: retaken)
  NodeList order;                // the nodes the faults took pages from, in order
  uint64_t unfaulted = 0;        // the mapping's pages not yet faulted then
  uint64_t faulted = 0;          // ... and faulted then
  long nodes_free = 0;           // free hugepages on `order`
  int64_t mem_free = 0, reclaim = 0;
  long hfree = 0, hresv = 0, hsurp = 0;
};

struct SimVma;

// What one SimKernel::fault_range call works with (sim_faults.cpp): the mapping, its object and
// hstate (nullptr: base pages), the policy that applies, the nodes in fallback order, and the
// mapping's pages [vfirst, vfirst + vcount) of the object.
struct SimFault {
  SimVma& v;
  SimObject& o;
  SimHState* h;
  const SimPolicy& pol;
  NodeList order;
  uint64_t vfirst = 0;
  uint64_t vcount = 0;
};

struct SimVma {
  uintptr_t start = 0;
  uintptr_t end = 0;
  int prot = 0;
  int flags = 0;
  SimObjectPtr obj;
  uint64_t pgoff = 0;      // first object page (in obj->page units) mapped at start
  bool noreserve = false;  // VM_NORESERVE (no hugetlb reservation)
  bool accounted = false;  // charged to Committed_AS
  bool real_rw = true;     // its real range is read-write memory (SimKernel::backed)
  SimPolicy policy;
  SimFaultBase fault_base;
  bool hugetlb() const { return obj && obj->h; }
  uint64_t len() const { return end - start; }
};

// Why a call failed (an errno), why the process died (a signal), or an event that decided an
// outcome (err = signal = 0): the rule applied and the numbers it compared. Recorded by every
// failing call, so an explanation never has to re-derive the kernel's arithmetic.
struct SimReason {
  std::string call;  // "mmap", "madvise(MADV_POPULATE_WRITE)", "prefault touch", ...
  std::string rule;  // its id in UMBP_SIM_REASON_RULES (kernel/reason_rules.h)
  int err = 0;
  int signal = 0;
  std::vector<std::pair<std::string, int64_t>> numbers;  // in the order the rule uses them
  std::string text;                                      // the rule in words, with the numbers
};
using SimNumbers = std::vector<std::pair<std::string, int64_t>>;

// The counters of one hugepage pool, declared once: SimPoolCounters' members, the order of
// SimKernel::hugepage_counters() and _native.HUGEPAGE_COUNTERS, whose names umbp_sim.sim.HugePages'
// fields are (tests/test_pool_counters.py).
#define UMBP_SIM_HUGEPAGE_COUNTERS(X) X(total) X(free) X(reserved) X(surplus)

struct SimPoolCounters {
#define UMBP_SIM_POOL_MEMBER(name) long name = 0;
  UMBP_SIM_HUGEPAGE_COUNTERS(UMBP_SIM_POOL_MEMBER)
#undef UMBP_SIM_POOL_MEMBER
  std::vector<long> in_order() const {
#define UMBP_SIM_POOL_VALUE(name) name,
    return {UMBP_SIM_HUGEPAGE_COUNTERS(UMBP_SIM_POOL_VALUE)};
#undef UMBP_SIM_POOL_VALUE
  }
};

// A simulated death's record, its fields declared once: SimCrash's members, the keys of Python's
// crash_info() (csrc/python/bind_sim.cpp), of the post-mortem JSON the interposer hands umbp-sim
// (csrc/capi/kernel_capi.cpp) and _native.CRASH_FIELDS, to which tests/test_crash_record.py
// holds Python's SimulatedCrash and KernelCrash. X(name, C++ type, value when unset, how it
// is written: Signal a name; Text as is; Node and Size null when unset).
#define UMBP_SIM_CRASH_FIELDS(X)      \
  X(signal, int, 0, Signal)           \
  X(where, std::string, "", Text)     \
  X(node, int, -1, Node)              \
  X(hugepage_size, uint64_t, 0, Size) \
  X(detail, std::string, "", Text)

struct SimCrash {
#define UMBP_SIM_CRASH_MEMBER(name, type, unset, kind) type name = unset;
  UMBP_SIM_CRASH_FIELDS(UMBP_SIM_CRASH_MEMBER)
#undef UMBP_SIM_CRASH_MEMBER
};

// One mapping as Python sees it (SimHost.mappings()).
struct SimMappingInfo {
  uintptr_t start = 0;
  uint64_t length = 0;
  int prot = 0;
  int flags = 0;
  uint64_t page_size = 0;
  bool hugetlb = false;
  bool shared = false;
  int policy_mode = 0;
  std::vector<int> policy_nodes;
  uint64_t faulted_pages = 0;
  uint64_t reserved_pages = 0;
  int64_t file_size = -1;     // a file's (memfd's) i_size; -1 for anonymous memory
  std::vector<int> file_fds;  // the open fds of that file ...
  int file_fds_cloexec = 0;   // ... and how many of them an exec closes
};

class SimKernel : public Kernel {
 public:
  explicit SimKernel(const SimConfig& cfg);
  ~SimKernel() override;

  UMBP_KERNEL_OVERRIDES

  // ---- admin knobs and inspection (Python: SimKernel methods) --------------------------
  // Write nr_hugepages for `size` (node < 0: /proc/sys/vm / global sysfs file, interleaved
  // over nodes with memory; else nodeN's file). Returns 0 or an errno.
  int set_nr_hugepages(uint64_t size, long count, int node);
  int set_nr_overcommit_hugepages(uint64_t size, long count);
  // set_mempolicy(2) of the simulated task (numactl --membind), checked at hugetlb mmap.
  int set_task_policy(int mode, const std::vector<int>& nodes);
  std::map<std::string, std::string> render_all();
  bool dead();
  SimCrash crash();
  std::vector<SimMappingInfo> mappings();
  std::vector<int> open_fds();
  // A pool's counters (SimPoolCounters) for a size, in declared order; node < 0 = global
  // (reserved is global only; per node it is 0); {} for an unknown size or node.
  std::vector<long> hugepage_counters(uint64_t size, int node);
  uint64_t committed_as();
  uint64_t commit_limit();  // CommitLimit in bytes
  // MemFree, MemAvailable, CommitLimit and each node's MemFree, page cache and reclaimable slab
  // now (what /proc/meminfo and the nodes' meminfo show), bytes.
  SimHostNumbers numbers();
  uint64_t total_vm();
  // Every reason recorded since construction (or the last clear_reasons), oldest first.
  std::vector<SimReason> reasons();
  void clear_reasons();
  // Reclaimable memory (page cache + SReclaimable) left on a node, and in total.
  uint64_t node_reclaimable(int node);
  // Whether `addr` is in a simulated mapping with real read-write memory behind it (Python can
  // write through the pointer); false outside any mapping and for a mapping the analyst's own
  // process had no room for (an unbacked range, or PROT_NONE on a strict-overcommit host).
  bool backed(uintptr_t addr);
  // The node of the page at `addr` (move_pages(2)'s status in query mode): its node when
  // faulted, -ENOENT when not (yet), -EFAULT outside every mapping (sim_page_node.cpp).
  int page_node(uintptr_t addr);
  // The pthread_atfork handlers of the process-wide table of unbacked ranges, registered now
  // (see memory_lifetimes.h register_fork_handlers).
  static void register_fork_handlers();

 private:
  // sim_kernel.cpp
  SimHState* hstate(uint64_t size);
  // sim_render.cpp: the files under `only` (a path; empty: every file), mu_ held.
  void render_locked(std::map<std::string, std::string>& f, const std::string& only);
  void render_sysctl_locked(std::map<std::string, std::string>& f, const SimHState* def);
  void render_hugepages_locked(std::map<std::string, std::string>& f);
  void render_nodes_locked(std::map<std::string, std::string>& f, const SimHState* def,
                           const std::string& only);
  bool has_memory(int node) const;
  std::vector<int> memory_nodes() const;
  bool version_at_least(int major, int minor) const;
  bool gigantic(const SimHState& h) const;
  long pool_pages_total() const;  // Σ nr × pages per hugepage, in base pages
  // Pool arithmetic (docs/kernel-model.md sections 1-2).
  int gather_surplus(SimHState& h, long delta);  // 0 or ENOMEM; resv += delta on success
  void return_unused_surplus(SimHState& h, long unused_resv);
  void free_huge_pages(SimHState& h, int node, long count);
  bool adjust_surplus(SimHState& h, const std::vector<int>& nodes, int delta);
  long node_mem_free(int node) const;
  void node_mem_take(int node, int64_t bytes);
  void release_object_range(SimObject& o, uint64_t first, uint64_t count);
  void drop_object_ref(const SimObjectPtr& o);
  uint64_t commit_limit_locked() const;
  int64_t mem_free_now_locked() const;
  int64_t mem_available_now_locked() const;
  SimNodeNumbers node_numbers_locked(const SimNodeConfig& n) const;
  SysResult die(int sig, const std::string& where, int node, uint64_t hsize,
                const std::string& detail);
  SysResult die(const std::string& where, int node, uint64_t hsize, SimReason r);
  // Record a reason for an errno and return the error.
  SysResult fail(int err, const std::string& call, ReasonRule rule, const std::string& text,
                 SimNumbers numbers = {});
  void note(const std::string& call, ReasonRule rule, const std::string& text,
            SimNumbers numbers = {});
  // After a public call: an errno with no reason recorded gets a generic one.
  void explain_errno(const char* call, const SysResult& r, uint64_t before);
  // One public syscall: `body` (a do_* below) under the lock; the call of a dead process is its
  // crash again; an errno `body` gave no reason for gets a generic one (explain_errno).
  // `advice` names a madvise call in the crash record.
  template <typename F>
  SysResult syscall(SysOp op, int advice, F&& body);
  template <typename F>
  SysResult syscall(SysOp op, F&& body) {
    return syscall(op, -1, std::forward<F>(body));
  }
  // Keep a reason; past kMaxReasons the oldest half is dropped (a long simulation keeps its
  // latest evidence without growing without bound).
  void record(SimReason r);
  static constexpr size_t kMaxReasons = 4096;
  int64_t reclaim(int node, int64_t bytes);  // take up to `bytes` of reclaimable memory
  long node_obtainable(int node) const;      // free + reclaimable

  // sim_faults.cpp
  NodeList fault_order(const SimPolicy& vma_policy, uint64_t index) const;
  // Fault pages [first, first+count) of vma's object. Returns 0, or a signal number for the
  // failure (SIGBUS / SIGKILL) with *why filled.
  int fault_range(SimVma& v, uint64_t first, uint64_t count, SimReason* why, int* node,
                  uint64_t* hsize);
  void take_fault_base(SimFault& f);
  int64_t faulted_since_base(const SimFault& f) const;
  std::vector<std::pair<int, long>> free_page_plan(const SimFault& f, long cap) const;
  long fault_surplus(SimFault& f, long need, long have, NodeCounts& got);
  int fault_hugetlb(SimFault& f, const PageSegment& seg, SimReason* why);
  int fault_base_pages(SimFault& f, const PageSegment& seg, SimReason* why);
  // `where`: the call, named only when a fault fails (a literal: no string built per call).
  SysResult populate(uintptr_t start, uintptr_t end, bool write, const char* where,
                     bool is_madvise);
  // sim_mmap.cpp, sim_address_space.cpp
  std::map<uintptr_t, SimVma>::iterator split_vma(uintptr_t at);
  void real_unmap(uintptr_t start, uintptr_t end);
  // 0 or an errno; *writable: the range is real read-write memory (not PROT_NONE, not unbacked).
  int reserve_real(uintptr_t hint, uint64_t len, uint64_t align, bool fixed, uintptr_t* out,
                   bool* writable);
  int commit_check(uint64_t bytes, uint64_t new_vm_bytes);
  SysResult munmap_locked(uintptr_t start, uintptr_t end);
  SysResult do_mmap(void* addr, size_t length, int prot, int flags, int fd, off_t offset);
  SysResult mmap_backing(int flags, int fd, bool anon, SimObjectPtr* file, SimHState** h);
  SysResult mmap_make_room(uintptr_t hint, uint64_t len, bool fixed, int flags);
  SysResult reserve_hugepages(SimHState& h, long delta);
  SysResult hugetlb_reserve_failed(const SimHState& h, long delta, long free0, long resv0,
                                   long surp0, SimNumbers pool);
  SysResult do_munmap(void* addr, size_t length);
  SysResult do_madvise(void* addr, size_t length, int advice);
  SysResult do_touch(void* addr, size_t length, size_t stride);
  SysResult do_mbind(void* addr, size_t length, int mode, const unsigned long* nodemask,
                     unsigned long maxnode, unsigned flags);
  SysResult do_memfd_create(const char* name, unsigned flags);
  SysResult do_ftruncate(int fd, off_t length);
  SysResult do_close(int fd);

  // Held across each public call (syscall()). Under the interposer it comes after the
  // interposer's mapping table lock (a fault's resolver holds that across touch()); the real
  // mmap/munmap this kernel makes under it come back through the interposer, which decides
  // them without that lock (csrc/interposer/interposer_internal.h: the lock order).
  std::mutex mu_;
  SimConfig cfg_;
  std::map<uint64_t, SimHState> hstates_;
  std::map<int, int64_t> node_free_;     // bytes free per node (buddy)
  std::map<int, int64_t> node_reclaim_;  // bytes of reclaimable page cache + slab per node
  int64_t reclaimed_ = 0;                // reclaimed since start (Cached/SReclaimable shrink)
  int64_t reclaimed_cache_ = 0;          // of which page cache
  std::map<int, int64_t> node_cache_reclaimed_;
  std::vector<SimReason> reasons_;
  uint64_t reasons_total_ = 0;  // reasons recorded since start (not reduced by trimming)
  int64_t mem_free_delta_ = 0;  // change of global MemFree since start
  uint64_t committed_ = 0;      // bytes committed by the simulated process
  uint64_t memcg_usage_ = 0;    // bytes charged to the memory cgroup
  SimPolicy task_policy_;
  std::map<uintptr_t, SimVma> vmas_;  // by start
  std::map<int, SimFd> fds_;
  int next_fd_ = 1000000;
  SimCrash crash_;
  // Small real ranges kept after a simulated munmap and handed out again (zeroed) by the next
  // mmap of that length: a real mmap+munmap pair costs microseconds on a VM, more than the
  // whole simulated call. Only read-write ranges of at most kRealCacheMaxLen bytes.
  static constexpr uint64_t kRealCacheMaxLen = 64 * 1024;
  static constexpr size_t kRealCachePerLen = 32;
  std::map<uint64_t, std::vector<uintptr_t>> real_cache_;  // length -> starts
  bool real_cache_ok_ = true;  // false once a PROT_NONE fallback mapping exists (no memset)
  void real_cache_evict(uintptr_t start, uintptr_t end);
};

template <typename F>
SysResult SimKernel::syscall(SysOp op, int advice, F&& body) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t before = reasons_total_;
  SysResult r = crash_.signal ? record_crash(crash_.signal, crash_where(op, advice)) : body();
  explain_errno(sysop_name(op), r, before);
  return r;
}

}  // namespace umbp
