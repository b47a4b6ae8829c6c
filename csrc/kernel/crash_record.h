// Which simulated fatal signal a kernel answered the calling thread with, and in which call:
// recorded by the kernel that raised it (SimKernel when it kills the process or answers after
// its death, FaultyKernel when a rule injects a signal), cleared and read by whoever drives one
// simulated process call (the Python binding around an allocator call). Harness only: the
// allocator sees SysResult::killed() and nothing of this.
#pragma once

#include <string>

#include "kernel/syscall_format.h"

namespace umbp {

// Trivially destructible on purpose: it is thread_local, and a std::string member's destructor
// at thread exit is reported by ThreadSanitizer as racing with glibc freeing the thread's TLS.
struct CallCrash {
  int signal = 0;       // 0: no call on this thread was answered with a signal since clear()
  char where[64] = {};  // "mmap", "madvise(MADV_POPULATE_WRITE)", "prefault touch", ...
  void clear() {
    signal = 0;
    where[0] = '\0';
  }
};

// This thread's record (the last fatal answer since its clear()).
CallCrash& this_thread_crash();

// Record a fatal answer on this thread and return it as the call's result.
SysResult record_crash(int signal, const std::string& where);

// What the allocator calls a fatal call to `op`: the op's name; madvise with its advice
// ("madvise(MADV_POPULATE_WRITE)"), touch as "prefault touch" (the manual prefault's faults).
std::string crash_where(SysOp op, int advice = -1);

}  // namespace umbp
