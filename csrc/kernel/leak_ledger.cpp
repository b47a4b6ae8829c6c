#include "kernel/leak_ledger.h"

#include <cerrno>

namespace umbp {

void LeakLedger::observe(const SyscallArgs& a, const SysResult& r, bool threw) {
  if (threw) return;
  if (!r.ok()) {
    // Linux releases the descriptor even when close() reports an error (not EBADF: never open).
    if (a.op == SysOp::close && r.signal == 0 && r.error != EBADF) fds_.erase(a.fd);
    return;
  }
  if (a.op == SysOp::mmap) {
    uintptr_t start = static_cast<uintptr_t>(r.value);
    size_t len = rounded(a.length);
    unmap_range(start, start + len);  // MAP_FIXED replaces what was there
    mappings_[start] = len;
  } else if (a.op == SysOp::munmap) {
    unmap_range(a.addr, a.addr + rounded(a.length));
  } else if (a.op == SysOp::memfd_create) {
    fds_.insert(static_cast<int>(r.value));
  } else if (a.op == SysOp::close) {
    fds_.erase(a.fd);
  }
}

std::vector<std::pair<uintptr_t, size_t>> LeakLedger::mappings() const {
  return {mappings_.begin(), mappings_.end()};
}

std::vector<int> LeakLedger::fds() const { return {fds_.begin(), fds_.end()}; }

void LeakLedger::unmap_range(uintptr_t start, uintptr_t end) {
  if (end <= start || mappings_.empty()) return;
  auto it = mappings_.upper_bound(start);
  if (it != mappings_.begin()) --it;
  while (it != mappings_.end() && it->first < end) {
    uintptr_t ms = it->first, me = it->first + it->second;
    if (me <= start) {
      ++it;
      continue;
    }
    it = mappings_.erase(it);
    if (ms < start) mappings_[ms] = start - ms;  // the part below the hole survives
    if (me > end) {
      mappings_[end] = me - end;  // and the part above it
      break;
    }
  }
}

}  // namespace umbp
