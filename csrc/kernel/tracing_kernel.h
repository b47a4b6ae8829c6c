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
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kernel/kernel.h"
#include "kernel/leak_ledger.h"
#include "kernel/syscall_format.h"

namespace umbp {

// Where a call came from, as the interposer saw it (the C ABI's set_call_site): the object's
// path and the offset in it of the call's return address minus one. object null: unknown.
struct CallSite {
  const char* object = nullptr;
  uintptr_t offset = 0;
};
// The call site of this thread's next call into a TracingKernel (set by the C ABI, taken by the
// TracingKernel the call reaches).
CallSite& pending_call_site();

struct TraceRecord {
  uint64_t seq = 0;  // 1-based call number on this TracingKernel
  SyscallArgs args;
  SysResult result;  // read_file: value = bytes read on success
  bool injected = false;
  bool threw = false;  // the call threw (std::bad_alloc injected, or the inner kernel's own)
  int32_t site = -1;   // index in the TracingKernel's call_sites(), -1: none known

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
  // The distinct call sites of the records (object path, offset), in order of first use; at
  // most kMaxCallSites (a call from a site past them records none: sites_dropped counts them).
  static constexpr size_t kMaxCallSites = 1024;
  std::vector<std::pair<std::string, uintptr_t>> call_sites() const;
  uint64_t sites_dropped() const;
  // Forget the records (the leak ledger stays: it describes the process, not the log).
  void clear();

  UMBP_KERNEL_OVERRIDES

 private:
  void record(SyscallArgs&& a, const SysResult& r, bool injected, bool threw, CallSite site);
  int32_t site_index(CallSite site);  // under mu_
  template <typename F>
  SysResult traced(SyscallArgs&& a, F&& f);

  KernelPtr inner_;
  size_t limit_;
  mutable std::mutex mu_;
  std::deque<TraceRecord> records_;
  uint64_t seq_ = 0;
  uint64_t dropped_ = 0;
  LeakLedger ledger_;  // under mu_
  // Call sites, under mu_: their table, their indices by object and offset, the objects seen.
  std::vector<std::pair<std::string, uintptr_t>> sites_;
  std::map<std::pair<size_t, uintptr_t>, int32_t> site_ids_;
  std::vector<std::string> site_objects_;
  uint64_t sites_dropped_ = 0;
};

}  // namespace umbp
