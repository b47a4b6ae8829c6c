// Linux's arithmetic over a host's numbers, once: MemAvailable (si_mem_available), each node's
// free memory and page cache at start, CommitLimit (vm_commit_limit) and the overcommit_ratio
// that gives one, the low watermarks of min_free_kbytes, and the round-robin spread of new
// hugepages over nodes (docs/kernel-model.md sections 3, 6 and 7). SimKernel derives its
// starting state with these (derive_start); the binding exports them, so Python asks instead
// of computing (umbp_sim.sim.start_numbers, umbp_sim.dump, Machine.build).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "kernel/sim_config.h"

namespace umbp {

// One node's numbers (bytes): at start, SimConfig's unknowns resolved, or now.
struct SimNodeNumbers {
  int id = 0;
  uint64_t mem_free = 0;
  uint64_t page_cache = 0;
  uint64_t slab_reclaimable = 0;
};

// What a SimKernel starts from (or shows now: SimKernel::numbers), bytes.
struct SimHostNumbers {
  uint64_t mem_free = 0;
  uint64_t mem_available = 0;
  uint64_t commit_limit = 0;
  std::vector<SimNodeNumbers> nodes;  // in the config's order
};

// The starting numbers of `cfg`: its own where given, else derived as Linux would show them.
SimHostNumbers derive_start(const SimConfig& cfg);

namespace rules {

// Whether /proc/meminfo prints MemAvailable: as the config says, else from 3.14 on (commit
// 34e431b0ae39; RHEL 7's 3.10 has it backported, which only a dump can say).
bool shows_mem_available(const SimConfig& cfg);

// Base pages of a config's hugetlb pools (the sizes the kernel has), at start.
uint64_t pool_pages(const SimConfig& cfg);

// si_mem_available (mm/show_mem.c): free memory above the low watermarks, plus the page cache
// and reclaimable slab less what reclaim cannot get back (half of each, at most the low
// watermark). Never below 0.
uint64_t si_mem_available(uint64_t free, uint64_t page_cache, uint64_t slab, uint64_t low);

// Σ low watermarks with the default min_free_kbytes of a host of `mem_total` bytes:
// min_free_kbytes = sqrt(lowmem kB * 16) within 128..262144 (mm/page_alloc.c
// calculate_min_free_kbytes), and low = min + min / 4.
uint64_t default_watermark_low(uint64_t mem_total);

// Σ low watermarks of a dumped vm.min_free_kbytes (low = 5/4 of min), bytes.
uint64_t watermark_low_from_min_free_kbytes(uint64_t min_free_kbytes);

// vm_commit_limit (mm/util.c), bytes: (MemTotal pages - hugetlb pool pages) * ratio / 100
// pages + swap, or overcommit_kbytes + swap when that is set.
uint64_t commit_limit(uint64_t mem_total, uint64_t pool_pages, uint64_t page_size, int64_t ratio,
                      uint64_t overcommit_kbytes, uint64_t swap);

// The overcommit_ratio a dumped CommitLimit was computed with (the bytes of the formula
// above, solved for ratio), or -1 when none is within 0.05 of a whole number.
int64_t solve_overcommit_ratio(uint64_t commit_limit, uint64_t mem_total, uint64_t pool_bytes,
                               uint64_t swap);

// The smallest overcommit_ratio whose CommitLimit reaches `target` bytes, or -1 when no
// ratio does (no memory outside the hugetlb pool).
int64_t overcommit_ratio_for(uint64_t target, uint64_t mem_total, uint64_t pool_pages,
                             uint64_t page_size, uint64_t swap);

// Spread `want` items over `nodes` as the kernel's round-robin does (for_each_node_mask_to_alloc
// / _to_free: one item per node in turn, starting at the first node, skipping nodes that are
// full), each node limited by cap(node). Whole rounds are given in bulk: after a round the
// cursor is back at its start, so dropping the nodes a round filled keeps the order.
template <typename T, typename Cap>
std::vector<std::pair<int, T>> distribute(T want, const std::vector<int>& nodes, Cap cap) {
  std::map<int, T> got;
  std::vector<int> live;
  for (int n : nodes)
    if (cap(n) > 0) live.push_back(n);
  while (want > 0 && !live.empty()) {
    const T width = static_cast<T>(live.size());
    if (want < width) {
      // A last, partial round: the first `want` nodes get one more each.
      for (T i = 0; i < want; ++i) got[live[static_cast<size_t>(i)]] += 1;
      break;
    }
    T rounds = want / width;
    for (int n : live) rounds = std::min<T>(rounds, cap(n) - got[n]);
    for (int n : live) got[n] += rounds;
    want -= rounds * width;
    std::vector<int> still;
    for (int n : live)
      if (cap(n) - got[n] > 0) still.push_back(n);
    live = std::move(still);
  }
  std::vector<std::pair<int, T>> out;
  for (int n : nodes)
    if (got[n] > 0) out.push_back({n, got[n]});
  return out;
}

// `count` new hugepages over `nodes` nodes with room for all (a write to vm.nr_hugepages on a
// host being described): each node's share, in order.
std::vector<uint64_t> interleave(uint64_t count, int nodes);

}  // namespace rules
}  // namespace umbp
