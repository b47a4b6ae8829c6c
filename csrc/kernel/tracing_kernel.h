// TracingKernel: wraps any Kernel and keeps an strace-like record of every call, plus the leak
// ledger of what it has seen: live mappings (successful mmap minus successful munmap) and open
// fds (successful memfd_create minus successful close).
//
// Records hold the raw arguments and results; text is formatted only when asked for, so tracing
// costs a lock and a copy per call. A result is marked "(injected)" when a FaultyKernel below
// answered the call (see last_result_injected()).
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kernel/kernel.h"
#include "kernel/leak_ledger.h"
#include "kernel/syscall_format.h"

namespace umbp {

struct TraceRecord {
  uint64_t seq = 0;  // 1-based call number on this TracingKernel
  SyscallArgs args;
  SysResult result;  // read_file: value = bytes read on success
  bool injected = false;
  bool threw = false;  // the call threw (std::bad_alloc injected, or the inner kernel's own)

  std::string text() const;  // one line, no newline
};

class TracingKernel final : public Kernel {
 public:
  // Keeps at most `limit` records (the oldest are dropped and counted); 0 = no limit.
  explicit TracingKernel(KernelPtr inner, size_t limit = 100000);
  ~TracingKernel() override;

  const KernelPtr& inner() const { return inner_; }
  std::vector<TraceRecord> records() const;
  std::string text() const;  // all records, one line each, '\n'-terminated
  uint64_t dropped() const;
  uint64_t calls() const;
  // (addr, length) of every mapping made through this kernel and not unmapped, by address.
  std::vector<std::pair<uintptr_t, size_t>> live_mappings() const;
  std::vector<int> open_fds() const;
  // Forget the records (the leak ledger stays: it describes the process, not the log).
  void clear();

  UMBP_KERNEL_OVERRIDES

 private:
  void record(SyscallArgs&& a, const SysResult& r, bool injected, bool threw);
  template <typename F>
  SysResult traced(SyscallArgs&& a, F&& f);

  KernelPtr inner_;
  size_t limit_;
  mutable std::mutex mu_;
  std::deque<TraceRecord> records_;
  uint64_t seq_ = 0;
  uint64_t dropped_ = 0;
  LeakLedger ledger_;  // under mu_
};

}  // namespace umbp
