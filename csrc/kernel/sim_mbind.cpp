// SimKernel::mbind: the errno table of docs/kernel-model.md section 3, in the kernel's order
// (kernel_mbind: sanitize flags, get_nodes; do_mbind: flags, range, mpol_new, nodemask
// contextualisation, holes, VMA splits).
#include <linux/mempolicy.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <iterator>
#include <string>
#include <vector>

#include "kernel/crash_record.h"
#include "kernel/sim_kernel.h"
#include "kernel/user_memory.h"

namespace umbp {

namespace {
constexpr unsigned long kMaxNumNodes = 1024;  // CONFIG_NODES_SHIFT=10
constexpr size_t kBitsPerLong = sizeof(unsigned long) * CHAR_BIT;
constexpr int kModeFlags = MPOL_F_STATIC_NODES | MPOL_F_RELATIVE_NODES | (1 << 13);
constexpr int kNumaBalancing = 1 << 13;
constexpr int kPreferredMany = 5;
constexpr int kWeightedInterleave = 6;
}  // namespace

SysResult SimKernel::mbind(void* addr, size_t length, int mode, const unsigned long* nodemask,
                           unsigned long maxnode, unsigned flags) {
  return syscall(SysOp::mbind,
                 [&] { return do_mbind(addr, length, mode, nodemask, maxnode, flags); });
}

SysResult SimKernel::do_mbind(void* addr, size_t length, int mode, const unsigned long* nodemask,
                              unsigned long maxnode, unsigned flags) {
  const uint64_t ps = cfg_.page_size;

  // sanitize_mpol_flags
  int mode_flags = mode & kModeFlags;
  int m = mode & ~kModeFlags;
  int max_mode = version_at_least(6, 9)    ? 7
                 : version_at_least(5, 15) ? 6
                 : version_at_least(3, 8)  ? 5
                                           : 4;
  if (m < 0 || m >= max_mode) return SysResult::Err(EINVAL);
  if ((mode_flags & MPOL_F_STATIC_NODES) && (mode_flags & MPOL_F_RELATIVE_NODES))
    return SysResult::Err(EINVAL);
  if (mode_flags & kNumaBalancing) {
    if (!version_at_least(5, 15) || (m != MPOL_BIND && m != kPreferredMany))
      return SysResult::Err(EINVAL);
  }

  // get_nodes: the kernel reads maxnode-1 bits (BITS_TO_LONGS of them, copy_from_user: a mask
  // that cannot be read is EFAULT).
  std::vector<int> user_nodes;
  if (nodemask && maxnode != 0) {
    unsigned long bits = maxnode - 1;
    if (bits > ps * 8) return SysResult::Err(EINVAL);
    std::vector<unsigned long> mask((bits + kBitsPerLong - 1) / kBitsPerLong);
    const size_t bytes = mask.size() * sizeof(unsigned long);
    if (!read_user_memory(nodemask, mask.data(), bytes)) {
      char at[32];
      std::snprintf(at, sizeof at, "0x%lx",
                    static_cast<unsigned long>(reinterpret_cast<uintptr_t>(nodemask)));
      return fail(
          EFAULT, "mbind", ReasonRule::mbind_mask_unreadable,
          "the nodemask at " + std::string(at) + " cannot be read (maxnode " +
              std::to_string(maxnode) + ": " + std::to_string(bytes) +
              " bytes): mbind fails with EFAULT",
          {{"maxnode", static_cast<int64_t>(maxnode)}, {"bytes", static_cast<int64_t>(bytes)}});
    }
    for (unsigned long b = 0; b < bits; ++b) {
      if (!(mask[b / kBitsPerLong] >> (b % kBitsPerLong) & 1UL)) continue;
      if (b >= kMaxNumNodes) return SysResult::Err(EINVAL);
      user_nodes.push_back(static_cast<int>(b));
    }
  } else if (nodemask && maxnode == 0) {
    return SysResult::Err(EINVAL);  // --maxnode wraps around
  }

  // do_mbind
  if (flags & ~static_cast<unsigned>(MPOL_MF_STRICT | MPOL_MF_MOVE | MPOL_MF_MOVE_ALL))
    return SysResult::Err(EINVAL);
  if ((flags & MPOL_MF_MOVE_ALL) && !cfg_.root) return SysResult::Err(EPERM);
  uintptr_t start = reinterpret_cast<uintptr_t>(addr);
  if (start % ps) return SysResult::Err(EINVAL);
  uint64_t len = (length + ps - 1) / ps * ps;
  uintptr_t end = start + len;
  if (len < length || end < start) return SysResult::Err(EINVAL);
  if (end == start) return SysResult::Ok(0);

  // mpol_new
  if (m == MPOL_DEFAULT) {
    if (!user_nodes.empty()) return SysResult::Err(EINVAL);
  } else if (m == MPOL_PREFERRED) {
    if (user_nodes.empty()) {
      if (mode_flags & (MPOL_F_STATIC_NODES | MPOL_F_RELATIVE_NODES)) return SysResult::Err(EINVAL);
      m = MPOL_LOCAL;
    }
  } else if (m == MPOL_LOCAL) {
    if (!user_nodes.empty() || (mode_flags & (MPOL_F_STATIC_NODES | MPOL_F_RELATIVE_NODES)))
      return SysResult::Err(EINVAL);
  } else if (user_nodes.empty()) {
    // The mask the kernel read (maxnode - 1 bits) holds no node: a node at or past bit
    // maxnode - 1 was dropped (mori's maxnode rule, docs/deployed-behaviour.md row 4).
    const int64_t read = maxnode == 0 ? 0 : static_cast<int64_t>(maxnode) - 1;
    return fail(EINVAL, "mbind", ReasonRule::mbind_empty_mask,
                "the node mask mbind reads (maxnode - 1 = " + std::to_string(read) +
                    " bits) holds no node: mbind fails with EINVAL",
                {{"maxnode", static_cast<int64_t>(maxnode)}, {"bits_read", read}});
  }
  // mpol_set_nodemask: only nodes with memory (cpuset mems = N_MEMORY here) survive.
  SimPolicy pol;
  pol.mode = m == MPOL_LOCAL ? MPOL_LOCAL : m;
  if (m != MPOL_DEFAULT && m != MPOL_LOCAL) {
    for (int n : user_nodes)
      if (has_memory(n)) pol.nodes.push_back(n);
    if (pol.nodes.empty()) {
      std::string with;
      for (int n : memory_nodes()) with += (with.empty() ? "" : ",") + std::to_string(n);
      return fail(EINVAL, "mbind", ReasonRule::mbind_node_without_memory,
                  "node " + std::to_string(user_nodes.front()) +
                      " has no memory (nodes with memory: " + (with.empty() ? "none" : with) +
                      "): mbind fails with EINVAL",
                  {{"node", user_nodes.front()}});
    }
    if (m == MPOL_PREFERRED) pol.nodes.resize(1);
    if (m == kWeightedInterleave) pol.mode = MPOL_INTERLEAVE;
  }

  // queue_pages_range: holes are EFAULT except for MPOL_DEFAULT; a range without any VMA is
  // EFAULT for every mode.
  bool any = false, hole = false;
  uintptr_t pos = start;
  auto first = vmas_.upper_bound(start);
  if (first != vmas_.begin()) --first;
  for (auto it = first; it != vmas_.end() && it->first < end; ++it) {
    if (it->second.end <= start) continue;
    if (it->second.start > pos) hole = true;
    any = true;
    pos = it->second.end;
  }
  if (pos < end) hole = true;
  if (!any || (hole && m != MPOL_DEFAULT)) return SysResult::Err(EFAULT);

  // mbind_range: identical policy needs no split; a hugetlb split inside a hugepage is EINVAL.
  for (auto it = first; it != vmas_.end() && it->first < end; ++it) {
    SimVma& v = it->second;
    if (v.end <= start || v.policy == pol) continue;
    if (v.hugetlb()) {
      uint64_t hs = v.obj->page;
      if ((start > v.start && start % hs) || (end < v.end && end % hs))
        return SysResult::Err(EINVAL);
    }
  }
  for (uintptr_t at : {start, end}) {
    auto c = vmas_.upper_bound(at);
    if (c != vmas_.begin() && !(std::prev(c)->second.policy == pol)) split_vma(at);
  }
  for (auto it = vmas_.lower_bound(start); it != vmas_.end() && it->first < end; ++it)
    it->second.policy = pol;
  return SysResult::Ok(0);
}

}  // namespace umbp
