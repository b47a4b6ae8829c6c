// The description a SimKernel starts from: plain data, filled from umbp_sim.machine.Machine.
// All sizes are bytes; page counts are pages of the size they belong to. The raw facts only:
// a number a dump may not give is kUnknown there, and SimKernel derives it as Linux shows it
// (sim_rules.h derive_start), never Python. Each field here is
// named by a Machine field's declaration (umbp_sim/machine.py MACHINE_FIELDS, or
// SIM_CONFIG_DERIVED); tests/test_machine_fields.py checks this struct's binding against it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace umbp {

// A number the description does not give (SimKernel derives it).
inline constexpr uint64_t kUnknown = UINT64_MAX;

// One hugepage size on one node.
struct SimPoolConfig {
  long total = 0;
  long free = 0;
  long surplus = 0;
};

struct SimNodeConfig {
  int id = 0;
  uint64_t mem_total = 0;  // 0: an online node without memory
  // kUnknown: derived (sim_rules.cpp): page cache and slab by MemTotal from the host's
  // figures; MemFree from the host's MemFree, else MemTotal less pools, cache and slab.
  uint64_t mem_free = kUnknown;
  uint64_t page_cache = kUnknown;        // reclaimable file pages (Active(file) + Inactive(file))
  uint64_t slab_reclaimable = kUnknown;  // SReclaimable
  std::string cpulist;
  std::vector<int> distances;
  std::map<uint64_t, SimPoolConfig> hugepages;  // size -> pool
};

struct SimConfig {
  uint64_t page_size = 4096;
  std::vector<uint64_t> hugepage_sizes;  // empty: no CONFIG_HUGETLB_PAGE
  uint64_t default_hugepage_size = 0;    // 0: none
  std::vector<SimNodeConfig> nodes;
  std::vector<int> possible_nodes;
  std::vector<int> online_nodes;
  bool numa_sysfs = true;
  std::map<uint64_t, long> hugepages_reserved;       // size -> pages held by other processes
  std::map<uint64_t, long> nr_overcommit_hugepages;  // size -> pages
  int overcommit_memory = 0;
  int overcommit_ratio = 50;
  uint64_t overcommit_kbytes = 0;
  uint64_t swap_total = 0;
  uint64_t mem_total = 0;
  uint64_t mem_free = kUnknown;       // kUnknown: the sum of the nodes'
  uint64_t mem_available = kUnknown;  // kUnknown: si_mem_available of the numbers below
  uint64_t page_cache = 0;            // the host's file LRU, spread over nodes without their own
  uint64_t slab_reclaimable = 0;      // the host's SReclaimable, spread the same way
  int show_mem_available = -1;        // /proc/meminfo has a MemAvailable line: 1/0, -1 the rule
                                      // (shows_mem_available: 3.14+; a dump of a backport says 1)
  uint64_t watermark_low = 0;         // sum of the zones' low watermarks, bytes (/proc/zoneinfo)
  uint64_t committed_as = 0;          // bytes committed by other processes
  uint64_t admin_reserve_kbytes = 8192;
  uint64_t user_reserve_kbytes = 131072;
  uint64_t rlimit_as = UINT64_MAX;  // UINT64_MAX: unlimited
  uint64_t base_vm = 0;             // VM the simulated process already has (counts for RLIMIT_AS)
  // The simulated process's user address space (TASK_SIZE): x86_64 0x7ffffffff000 (4-level
  // paging), arm64 2^48 (48-bit VA). More than fits is ENOMEM from mmap, on any analyst's host.
  uint64_t task_size = (uint64_t{1} << 47) - 4096;
  uint64_t memcg_max = UINT64_MAX;                       // UINT64_MAX: "max"
  std::map<uint64_t, uint64_t> hugetlb_cgroup_max;       // size -> bytes (fault-time limit)
  std::map<uint64_t, uint64_t> hugetlb_cgroup_rsvd_max;  // size -> bytes (mmap-time limit)
  std::string kernel_release = "6.18.0";
  int kernel_major = 6;
  int kernel_minor = 18;
  bool root = true;  // CAP_SYS_ADMIN / CAP_SYS_NICE
};

// Every field of the three structs above, once: the Python binding (csrc/python/bind_sim.cpp)
// and exec's host file reader (csrc/capi/exec_host.cpp) walk these lists, so a new field is
// added here and in its struct, nowhere else.
// clang-format off
#define UMBP_SIM_POOL_FIELDS(X) X(total) X(free) X(surplus)
#define UMBP_SIM_NODE_FIELDS(X) \
  X(id) X(mem_total) X(mem_free) X(page_cache) X(slab_reclaimable) X(cpulist) X(distances) \
  X(hugepages)
#define UMBP_SIM_CONFIG_FIELDS(X) \
  X(page_size) X(hugepage_sizes) X(default_hugepage_size) X(nodes) X(possible_nodes) \
  X(online_nodes) X(numa_sysfs) X(hugepages_reserved) X(nr_overcommit_hugepages) \
  X(overcommit_memory) X(overcommit_ratio) X(overcommit_kbytes) X(swap_total) X(mem_total) \
  X(mem_free) X(mem_available) X(page_cache) X(slab_reclaimable) X(show_mem_available) \
  X(watermark_low) X(committed_as) X(admin_reserve_kbytes) X(user_reserve_kbytes) X(rlimit_as) \
  X(base_vm) X(task_size) X(memcg_max) X(hugetlb_cgroup_max) X(hugetlb_cgroup_rsvd_max) \
  X(kernel_release) X(kernel_major) X(kernel_minor) X(root)
// clang-format on

}  // namespace umbp
