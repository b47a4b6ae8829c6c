// Every rule SimKernel records a reason under (SimReason: why a call failed, why the process
// died, or an event that decided an outcome), declared once:
//   X(id, "the numbers it may carry, in order", "what it means")
// SimKernel's fail()/note() take a ReasonRule, so an id that is not here does not compile; a
// reason whose numbers are not the rule's (a subset, in this order) is a logic_error when it
// is recorded; Python reads the table as _native.REASON_RULES, and tests/test_reason_rules.py
// holds every rule id umbp_sim compares against to it.
#pragma once

#include <string>
#include <utility>
#include <vector>

// The numbers several rules share: a hugetlb pool as a reservation at mmap saw it, a hugetlb
// fault, a fault of base pages that ended in the OOM killer.
#define UMBP_SIM_POOL_NUMBERS \
  "hugepage_size pages_needed free reserved available surplus surplus_allowed"
#define UMBP_SIM_HUGETLB_FAULT_NUMBERS \
  "hugepage_size node pages_needed pages_faulted node_free free reserved surplus surplus_allowed"
#define UMBP_SIM_OOM_NUMBERS "node node_count bytes_needed bytes_faulted node_free reclaimable"

#define UMBP_SIM_REASON_RULES(X)                                                             \
  X(arguments, "", "the call rejects these arguments on this kernel (no rule of the model)") \
  X(segv, "", "a touch of an unmapped or read-only address: SIGSEGV")                        \
  X(signal, "", "the process was killed by a signal the model does not explain further")     \
  X(memfd_beyond_eof, "file_size", "a fault past the end of a memfd: SIGBUS")                \
  X(hugetlb_fault_no_page, UMBP_SIM_HUGETLB_FAULT_NUMBERS,                                   \
    "a hugetlb fault found no free hugepage on the allowed nodes: SIGBUS")                   \
  X(hugetlb_cgroup_limit, UMBP_SIM_HUGETLB_FAULT_NUMBERS " limit",                           \
    "a hugetlb fault past the hugetlb cgroup's limit: SIGBUS")                               \
  X(oom, UMBP_SIM_OOM_NUMBERS,                                                               \
    "a fault found no memory on the allowed nodes: the OOM killer's SIGKILL")                \
  X(memcg_oom, UMBP_SIM_OOM_NUMBERS " limit",                                                \
    "a fault past the memory cgroup's limit: the OOM killer's SIGKILL")                      \
  X(populate_unsupported, "kernel_major kernel_minor",                                       \
    "MADV_POPULATE_WRITE/READ before 5.14: EINVAL")                                          \
  X(mbind_mask_unreadable, "maxnode bytes", "mbind's nodemask cannot be read: EFAULT")       \
  X(mbind_empty_mask, "maxnode bits_read", "the nodemask mbind reads holds no node: EINVAL") \
  X(mbind_node_without_memory, "node", "mbind to a node without memory: EINVAL")             \
  X(memfd_unsupported, "", "memfd_create before 3.17: ENOSYS")                               \
  X(memfd_hugetlb_unsupported, "", "MFD_HUGETLB before 4.14: EINVAL")                        \
  X(hugepage_size_unknown, "hugepage_size",                                                  \
    "a hugepage size this kernel does not have: EINVAL (mmap), ENODEV or ENOSYS (memfd)")    \
  X(overcommit_heuristic, "length mem_total swap_total",                                     \
    "overcommit_memory 0: one mapping larger than RAM + swap: ENOMEM")                       \
  X(commit_limit, "length committed_as commit_limit limit",                                  \
    "overcommit_memory 2: Committed_AS would pass the commit limit: ENOMEM")                 \
  X(address_space, "length vm task_size", "no room in the address space: ENOMEM")            \
  X(rlimit_as, "vm length limit", "RLIMIT_AS would be passed: ENOMEM")                       \
  X(hugetlb_cgroup_rsvd, "hugepage_size pages_needed limit",                                 \
    "the hugetlb cgroup's reservation limit (5.7+) at mmap: ENOMEM")                         \
  X(hugetlb_reserve_mpol_bind, "hugepage_size pages_needed free",                            \
    "the task's MPOL_BIND nodes lack the free hugepages at mmap (5.9+): ENOMEM")             \
  X(hugetlb_reserve, UMBP_SIM_POOL_NUMBERS,                                                  \
    "the pool cannot reserve the hugepages at mmap: ENOMEM")                                 \
  X(hugetlb_surplus_no_memory, UMBP_SIM_POOL_NUMBERS " surplus_obtainable",                  \
    "surplus hugepages allowed, but the buddy allocator cannot give them: ENOMEM")           \
  X(hugetlb_surplus_gathered, UMBP_SIM_POOL_NUMBERS,                                         \
    "mmap reserved hugepages, some allocated as surplus pages (an event)")                   \
  X(hugetlb_reserved, UMBP_SIM_POOL_NUMBERS, "mmap reserved hugepages from the pool (an event)")

namespace umbp {

enum class ReasonRule : int {
#define UMBP_SIM_REASON_RULE_ENUMERATOR(id, numbers, meaning) id,
  UMBP_SIM_REASON_RULES(UMBP_SIM_REASON_RULE_ENUMERATOR)
#undef UMBP_SIM_REASON_RULE_ENUMERATOR
};

struct ReasonRuleInfo {
  const char* id;
  const char* numbers;  // space-separated names
  const char* meaning;
};

const ReasonRuleInfo& reason_rule(ReasonRule rule);
const std::vector<ReasonRuleInfo>& reason_rules();

// Empty when `numbers` are among the rule's, in its order; otherwise what is wrong.
std::string reason_numbers_problem(const std::string& rule,
                                   const std::vector<std::pair<std::string, int64_t>>& numbers);

}  // namespace umbp
