// Reading memory the caller of a simulated syscall handed over (an mbind nodemask) as the
// kernel's copy_from_user does: a range that cannot be read is an answer (EFAULT), never a
// SIGSEGV of the process that runs the simulation.
#pragma once

#include <cstddef>

namespace umbp {

// Copies n bytes at src (an address of this process) to dst. False, with nothing of src
// dereferenced here, when any of the n bytes cannot be read (unmapped, PROT_NONE, NULL).
// The kernel reads the range (process_vm_readv on this process; where that is refused, a
// pipe's write()).
bool read_user_memory(const void* src, void* dst, size_t n);

}  // namespace umbp
