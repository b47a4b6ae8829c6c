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
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kernel/kernel.h"
#include "kernel/syscall_format.h"

namespace umbp {

struct TraceRecord {
  uint64_t seq = 0;  // 1-based call number on this TracingKernel
  SyscallArgs args;
  SysResult result;  // read_file: value = bytes read on success
  bool injected = false;

  std::string text() const;  // one line, no newline
};

class TracingKernel final : public Kernel {
 public:
  // Keeps at most `limit` records (the oldest are dropped and counted); 0 = no limit.
  explicit TracingKernel(KernelPtr inner, size_t limit = 100000);

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

  size_t page_size() override;
  SysResult mmap(void* addr, size_t length, int prot, int flags, int fd, off_t offset) override;
  SysResult munmap(void* addr, size_t length) override;
  SysResult madvise(void* addr, size_t length, int advice) override;
  SysResult mbind(void* addr, size_t length, int mode, const unsigned long* nodemask,
                  unsigned long maxnode, unsigned flags) override;
  SysResult memfd_create(const char* name, unsigned flags) override;
  SysResult ftruncate(int fd, off_t length) override;
  SysResult close(int fd) override;
  FileResult read_file(const std::string& path) override;
  SysResult touch(void* addr, size_t length, size_t stride) override;

 private:
  void record(SyscallArgs&& a, const SysResult& r, bool injected);
  void unmap_range(uintptr_t start, uintptr_t end);  // mu_ held

  KernelPtr inner_;
  size_t limit_;
  size_t page_;
  mutable std::mutex mu_;
  std::deque<TraceRecord> records_;
  uint64_t seq_ = 0;
  uint64_t dropped_ = 0;
  std::map<uintptr_t, size_t> mappings_;  // start -> length (page-rounded)
  std::set<int> fds_;
};

}  // namespace umbp
