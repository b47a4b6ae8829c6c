// FaultyKernel: wraps any Kernel and answers chosen calls with an injected errno or a simulated
// fatal signal, by rule. The model is libfiu's (a named failure point, a "when", an errno) made
// argument-aware and counted per rule.
//
// Semantics (the contract the Python FaultPlan documents):
//   - A rule applies to one operation. A call "matches" a rule when the operation is the same and
//     every argument filter passes. Each rule counts its matching calls (1-based `call` index),
//     whether or not it or another rule fires on them, so one rule's schedule never depends on
//     the others.
//   - A matching call fires the rule when its schedule selects the call index (always / nth /
//     range [a,b] / every k-th: k, 2k, ... / first N), the seeded probability draw passes, and the
//     rule has fired fewer than max_fires times (0 = unlimited).
//   - Rules are tried in order; the first one that fires wins and answers the call. The inner
//     kernel is then NOT called (an injected munmap leaves the mapping in place). The answer is
//     an errno, a simulated fatal signal (an OOM kill can land in any call; SIGBUS in a touch),
//     or for read_file replacement content (a /proc or /sys file as another kernel writes it),
//     or a std::bad_alloc thrown out of the call.
//   - Probability is a pure function of (seed, rule index, call index): the same seed fires on
//     the same call indices in every run. With several threads the calls are numbered in the
//     order they take the rule lock, so which thread's call gets which index can vary; the set
//     of fired indices does not.
//   - Thread-safe: one mutex per FaultyKernel, taken only for operations that have rules.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "kernel/kernel.h"
#include "kernel/syscall_format.h"

namespace umbp {

struct FaultRule {
  std::string name;  // for records and messages; may be empty
  SysOp op = SysOp::mmap;
  // The answer: exactly one of
  int error = 0;   // an errno,
  int signal = 0;  // a simulated fatal signal (the process dies in this call; not read_file),
  bool has_content = false;  // read_file only: these bytes instead of the file's
  std::string content;
  bool throw_bad_alloc = false;  // the call throws std::bad_alloc (the kernel layer ran out of
                                 // memory): tests that callers which promise not to throw don't

  enum class When : int { Always = 0, Nth, Range, Every, First };
  When when = When::Always;
  uint64_t a = 0;  // Nth: n; Range: first index; Every: k; First: N
  uint64_t b = 0;  // Range: last index (inclusive)
  double probability = 1.0;
  uint64_t seed = 0;
  uint64_t max_fires = 0;  // 0: unlimited

  // Argument filters; the defaults accept everything.
  int flags_has = 0;    // mmap: all these flag bits set (outside the type and hugepage fields)
  int flags_lacks = 0;  // mmap: none of these bits set
  int map_type = -1;    // mmap: flags & 0xf must equal this (MAP_SHARED=1, MAP_PRIVATE=2)
  int map_type_not = -1;
  int huge_log2 = -1;      // mmap/memfd: the MAP_HUGE_/MFD_HUGE_ field must equal this
  int huge_log2_not = -1;  // ... must differ from this
  uint64_t min_length = 0;
  uint64_t max_length = UINT64_MAX;
  int advice = -1;                 // madvise
  int node = -1;                   // mbind: this node is in the mask
  int mode = -1;                   // mbind: mode without the MPOL_F_* flags
  unsigned memfd_flags_has = 0;    // memfd_create: all these bits set
  unsigned memfd_flags_lacks = 0;  // memfd_create: none of these bits set
  std::string path;                // read_file: exact path or fnmatch(3) glob; empty = any

  // Empty if the rule is usable, else why not (e.g. "signal is only for touch and madvise").
  std::string problem() const;
  bool matches(const SyscallArgs& a) const;
};

// FaultRule's plain fields, once (op, when and content are converted by hand): the Python
// binding (csrc/python/bind_faults.cpp) and exec's plan reader (csrc/capi/exec_host.cpp).
// clang-format off
#define UMBP_FAULT_RULE_FIELDS(X) \
  X(name) X(error) X(signal) X(throw_bad_alloc) X(a) X(b) X(probability) X(seed) X(max_fires) \
  X(flags_has) X(flags_lacks) X(map_type) X(map_type_not) X(huge_log2) X(huge_log2_not) \
  X(min_length) X(max_length) X(advice) X(node) X(mode) X(memfd_flags_has) \
  X(memfd_flags_lacks) X(path)
// clang-format on

// One injected answer.
struct FaultRecord {
  size_t rule = 0;
  std::string rule_name;
  uint64_t call = 0;  // the rule's 1-based matching-call index
  SyscallArgs args;
  int error = 0;
  int signal = 0;
  bool threw = false;
};

// Set to true by FaultyKernel on the calling thread when it answers a call itself. A wrapper
// above it (TracingKernel) clears it before calling down and reads it after, so a result can be
// labelled "(injected)" without a field in SysResult.
bool& last_result_injected();

class FaultyKernel final : public Kernel {
 public:
  // Throws std::invalid_argument naming the rule for an unusable rule.
  FaultyKernel(KernelPtr inner, std::vector<FaultRule> rules);
  ~FaultyKernel() override;

  const KernelPtr& inner() const { return inner_; }
  const std::vector<FaultRule>& rules() const { return rules_; }
  std::vector<FaultRecord> records() const;
  uint64_t calls(size_t rule) const;  // matching calls seen by the rule
  uint64_t fires(size_t rule) const;  // times it fired
  // Forget counters and records (the rules stay).
  void reset();

  UMBP_KERNEL_OVERRIDES

 private:
  bool active(SysOp op) const { return active_[static_cast<int>(op)]; }
  // True (and `out` set) when a rule fires on this call.
  // For read_file, `content` receives a content answer.
  bool inject(SyscallArgs&& a, SysResult& out, std::string* content = nullptr);

  KernelPtr inner_;
  std::vector<FaultRule> rules_;
  bool active_[kSysOpCount] = {};
  mutable std::mutex mu_;
  std::vector<uint64_t> calls_;
  std::vector<uint64_t> fires_;
  std::vector<FaultRecord> records_;
};

}  // namespace umbp
