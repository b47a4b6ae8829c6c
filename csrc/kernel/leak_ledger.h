// LeakLedger: what a process holds, as the calls through the seam show it: live mappings
// (successful mmap minus successful munmap, page-rounded, split by partial unmaps) and open fds
// (successful memfd_create minus close). Fed every call's arguments and result by a wrapping
// kernel (TracingKernel carries one), so it sees what any allocator took, also what that
// allocator's own bookkeeping forgot. The leak checks (umbp_sim/host/leaks.py) read it.
//
// Not thread-safe: the kernel that carries it locks around observe() and the queries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "kernel/kernel.h"
#include "kernel/syscall_format.h"

namespace umbp {

class LeakLedger {
 public:
  // `page`: the page size lengths are rounded up to (the kernel's page_size()).
  explicit LeakLedger(size_t page) : page_(page ? page : 4096) {}

  // One call and its result; `threw`: the call threw (nothing changed hands).
  void observe(const SyscallArgs& a, const SysResult& r, bool threw);

  // (addr, length) of every mapping made and not unmapped, by address.
  std::vector<std::pair<uintptr_t, size_t>> mappings() const;
  std::vector<int> fds() const;

 private:
  void unmap_range(uintptr_t start, uintptr_t end);
  size_t rounded(size_t length) const { return (length + page_ - 1) / page_ * page_; }

  size_t page_;
  std::map<uintptr_t, size_t> mappings_;  // start -> length (page-rounded)
  std::set<int> fds_;
};

}  // namespace umbp
