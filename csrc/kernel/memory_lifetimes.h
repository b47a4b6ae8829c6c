// Whose memory a buffer is, and whether it is still there: a buffer mapped through a SimKernel
// (or through wrappers over one, kernel ids of their own) lives in that SimKernel's real
// reservations, unmapped when the SimKernel is destroyed. A handle names its kernel by id
// (HostBufferHandle::kernel_id); memory_gone() tells the binding that its address no longer
// points to the buffer, so using it is an error instead of a SIGSEGV. A real kernel's buffers
// never go with its Kernel object: they are never "gone".
//
// Bounded: live kernels are entries; kernels gone are runs of ids (ids are handed out in order).
#pragma once

#include <cstdint>

namespace umbp {

void note_simulated_memory(uint64_t sim_kernel_id);         // SimKernel constructed
void note_wrapper(uint64_t wrapper_id, uint64_t inner_id);  // a wrapper over inner_id
void note_kernel_gone(uint64_t kernel_id);                  // its destructor
bool memory_gone(uint64_t kernel_id);                       // its buffers' memory is gone

// Registers now the pthread_atfork handlers of the kernel library's process-wide tables (this
// one and SimKernel's unbacked ranges: each takes its lock across fork()). A caller that holds
// fork() off until its calls into kernels are done (the Python binding, native_call.h)
// registers its own handlers after these, so that its prepare handler runs first.
void register_fork_handlers();

}  // namespace umbp
