// Linux's arithmetic over a host's numbers (sim_rules.h), and SimKernel's starting numbers.
#include "kernel/sim_rules.h"

#include <climits>
#include <cmath>

namespace umbp {

namespace {

using u128 = unsigned __int128;

uint64_t saturated(u128 v) { return v > UINT64_MAX ? UINT64_MAX : static_cast<uint64_t>(v); }

// Each node's part of `total`: its own figure where `given` has one, else its share (by
// MemTotal) of what the given figures leave; the last node without one takes the remainder.
std::vector<uint64_t> shares(uint64_t total, const std::vector<uint64_t>& given,
                             const std::vector<SimNodeConfig>& nodes) {
  uint64_t known = 0;
  u128 weight = 0;
  size_t last = nodes.size();
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (given[i] != kUnknown) {
      known += given[i];
    } else {
      weight += nodes[i].mem_total;
      last = i;
    }
  }
  const uint64_t rest = total > known ? total - known : 0;
  uint64_t left = rest;
  std::vector<uint64_t> out;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (given[i] != kUnknown) {
      out.push_back(given[i]);
      continue;
    }
    uint64_t share =
        weight ? static_cast<uint64_t>(u128{rest} * nodes[i].mem_total / weight) : uint64_t{0};
    if (i == last) share = left;
    left -= share;
    out.push_back(share);
  }
  return out;
}

uint64_t node_pool_bytes(const SimNodeConfig& n) {
  uint64_t b = 0;
  for (const auto& [size, p] : n.hugepages) b += size * static_cast<uint64_t>(p.total);
  return b;
}

}  // namespace

SimHostNumbers derive_start(const SimConfig& cfg) {
  std::vector<uint64_t> given_cache, given_slab, given_free;
  for (const auto& n : cfg.nodes) {
    given_cache.push_back(n.page_cache);
    given_slab.push_back(n.slab_reclaimable);
    given_free.push_back(n.mem_free);
  }
  const auto caches = shares(cfg.page_cache, given_cache, cfg.nodes);
  const auto slabs = shares(cfg.slab_reclaimable, given_slab, cfg.nodes);
  // A node's MemFree: its own; else its share of the host's MemFree; else MemTotal less its
  // hugepage pools, page cache and reclaimable slab.
  std::vector<uint64_t> frees;
  if (cfg.mem_free != kUnknown) {
    frees = shares(cfg.mem_free, given_free, cfg.nodes);
  } else {
    for (size_t i = 0; i < cfg.nodes.size(); ++i) {
      const SimNodeConfig& n = cfg.nodes[i];
      const u128 used = u128{node_pool_bytes(n)} + caches[i] + slabs[i];
      frees.push_back(given_free[i] != kUnknown ? given_free[i]
                      : n.mem_total > used      ? static_cast<uint64_t>(n.mem_total - used)
                                                : 0);
    }
  }
  SimHostNumbers out;
  uint64_t free_sum = 0;
  for (size_t i = 0; i < cfg.nodes.size(); ++i) {
    out.nodes.push_back({cfg.nodes[i].id, frees[i], caches[i], slabs[i]});
    free_sum += frees[i];
  }
  out.mem_free = cfg.mem_free != kUnknown ? cfg.mem_free : free_sum;
  out.mem_available = cfg.mem_available != kUnknown
                          ? cfg.mem_available
                          : rules::si_mem_available(out.mem_free, cfg.page_cache,
                                                    cfg.slab_reclaimable, cfg.watermark_low);
  out.commit_limit =
      rules::commit_limit(cfg.mem_total, rules::pool_pages(cfg), cfg.page_size,
                          cfg.overcommit_ratio, cfg.overcommit_kbytes, cfg.swap_total);
  return out;
}

namespace rules {

bool shows_mem_available(const SimConfig& cfg) {
  if (cfg.show_mem_available >= 0) return cfg.show_mem_available != 0;
  return cfg.kernel_major > 3 || (cfg.kernel_major == 3 && cfg.kernel_minor >= 14);
}

uint64_t pool_pages(const SimConfig& cfg) {
  uint64_t pages = 0;
  for (uint64_t size : cfg.hugepage_sizes)
    for (const auto& n : cfg.nodes) {
      auto it = n.hugepages.find(size);
      if (it != n.hugepages.end())
        pages += static_cast<uint64_t>(it->second.total) * (size / cfg.page_size);
    }
  return pages;
}

uint64_t si_mem_available(uint64_t free, uint64_t page_cache, uint64_t slab, uint64_t low) {
  __int128 avail = static_cast<__int128>(free) - low;
  avail += page_cache - std::min(page_cache / 2, low);
  avail += slab - std::min(slab / 2, low);
  return avail > 0 ? saturated(static_cast<u128>(avail)) : 0;
}

uint64_t default_watermark_low(uint64_t mem_total) {
  const uint64_t lowmem_kb = mem_total / 1024;
  // int_sqrt, exact for any 64-bit value (the double's guess corrected by one either way)
  const u128 x = u128{lowmem_kb} * 16;
  uint64_t r = static_cast<uint64_t>(std::sqrt(static_cast<long double>(x)));
  while (r > 0 && u128{r} * r > x) --r;
  while (u128{r + 1} * (r + 1) <= x) ++r;
  const uint64_t min_kb = std::min<uint64_t>(262144, std::max<uint64_t>(128, r));
  return (min_kb + min_kb / 4) * 1024;
}

uint64_t watermark_low_from_min_free_kbytes(uint64_t min_free_kbytes) {
  return saturated(u128{min_free_kbytes} * 1024 * 5 / 4);
}

uint64_t commit_limit(uint64_t mem_total, uint64_t pool_pages, uint64_t page_size, int64_t ratio,
                      uint64_t overcommit_kbytes, uint64_t swap) {
  if (overcommit_kbytes) return saturated(u128{overcommit_kbytes} * 1024 + swap);
  const uint64_t total_pages = mem_total / page_size;
  const uint64_t pages = total_pages > pool_pages ? total_pages - pool_pages : 0;
  const u128 r = ratio > 0 ? static_cast<u128>(ratio) : 0;
  return saturated(u128{pages} * r / 100 * page_size + swap);
}

int64_t solve_overcommit_ratio(uint64_t commit_limit, uint64_t mem_total, uint64_t pool_bytes,
                               uint64_t swap) {
  if (mem_total <= pool_bytes || commit_limit < swap) return -1;
  const u128 ram = mem_total - pool_bytes;
  const u128 num = u128{commit_limit - swap} * 100;
  u128 nearest = num / ram;
  if (2 * (num % ram) > ram) ++nearest;
  const u128 off = num > nearest * ram ? num - nearest * ram : nearest * ram - num;
  if (20 * off > ram || nearest > static_cast<u128>(INT64_MAX)) return -1;  // > 0.05 away
  return static_cast<int64_t>(nearest);
}

int64_t overcommit_ratio_for(uint64_t target, uint64_t mem_total, uint64_t pool_pages,
                             uint64_t page_size, uint64_t swap) {
  if (target <= swap) return 0;
  const uint64_t total_pages = mem_total / page_size;
  const uint64_t pages = total_pages > pool_pages ? total_pages - pool_pages : 0;
  if (pages == 0) return -1;
  // floor(pages * ratio / 100) pages must cover ceil((target - swap) / page_size)
  const u128 need = (u128{target - swap} + page_size - 1) / page_size;
  const u128 ratio = (need * 100 + pages - 1) / pages;
  return ratio > static_cast<u128>(INT64_MAX) ? -1 : static_cast<int64_t>(ratio);
}

std::vector<uint64_t> interleave(uint64_t count, int nodes) {
  std::vector<int> ids;
  for (int i = 0; i < nodes; ++i) ids.push_back(i);
  std::vector<uint64_t> out(ids.size(), 0);
  for (const auto& [n, c] : distribute(count, ids, [](int) { return UINT64_MAX; }))
    out[static_cast<size_t>(n)] = c;
  return out;
}

}  // namespace rules
}  // namespace umbp
