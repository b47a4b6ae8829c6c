#include "kernel/crash_record.h"

#include <algorithm>

namespace umbp {

CallCrash& this_thread_crash() {
  thread_local CallCrash crash;
  return crash;
}

SysResult record_crash(int signal, const std::string& where) {
  CallCrash& c = this_thread_crash();
  c.signal = signal;
  const size_t n = std::min(where.size(), sizeof c.where - 1);  // the longest is ~30 characters
  where.copy(c.where, n);
  c.where[n] = '\0';
  return SysResult::Crash(signal);
}

std::string crash_where(SysOp op, int advice) {
  if (op == SysOp::touch) return "prefault touch";
  if (op == SysOp::madvise) return "madvise(" + format_madvise_advice(advice) + ")";
  return sysop_name(op);
}

}  // namespace umbp
