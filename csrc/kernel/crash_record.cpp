#include "kernel/crash_record.h"

namespace umbp {

CallCrash& this_thread_crash() {
  thread_local CallCrash crash;
  return crash;
}

SysResult record_crash(int signal, const std::string& where) {
  CallCrash& c = this_thread_crash();
  c.signal = signal;
  c.where = where;
  return SysResult::Crash(signal);
}

std::string crash_where(SysOp op, int advice) {
  if (op == SysOp::Touch) return "prefault touch";
  if (op == SysOp::Madvise) return "madvise(" + format_madvise_advice(advice) + ")";
  return sysop_name(op);
}

}  // namespace umbp
