/* The interposer's control API (libumbp_sim_interpose.so, umbp_sim.interposer_path()).
 *
 * The interposer routes an allocator's OS calls to a umbp_sim_kernel: mmap, munmap, madvise,
 * mbind, syscall(SYS_mbind | SYS_memfd_create), memfd_create, ftruncate, close,
 * sysconf(_SC_PAGESIZE) and opens of /proc and /sys paths (open, openat, fopen and their 64-bit
 * and fortified forms: what std::ifstream reaches). Two ways to attach:
 *   - LD_PRELOAD=libumbp_sim_interpose.so: a call is the allocator's when it comes from a
 *     registered caller object (umbp_sim_interposer_add_caller_object) on a thread inside
 *     umbp_sim_interposer_enter()/leave(); opens of /proc and /sys count when the thread is
 *     inside, whoever calls (std::ifstream calls from libstdc++);
 *   - link time: the allocator's objects linked with -Wl,--wrap=SYMBOL for each symbol above and
 *     against this library (`umbp-sim build-allocator`): every wrapped call is the allocator's
 *     while its thread is inside enter()/leave();
 *   - a whole program (`umbp-sim exec -- CMD`: UMBP_SIM_EXEC names the host's description, see
 *     csrc/interposer/exec_mode.cpp): the host starts before main(), and every call of the
 *     program's own objects, on every thread, is the host's (the C and C++ runtime's and the
 *     Python interpreter's are not), with syscall(SYS_move_pages) in query mode and opendir,
 *     stat, lstat and access of /proc and /sys paths too.
 * Everything else goes to the real kernel untouched. A fd the Kernel created (memfd_create) is
 * only ever passed to the Kernel, whoever calls, so a simulated fd never reaches a real syscall.
 *
 * On a simulated kernel (UMBP_SIM_KERNEL_SIMULATED) a touch of a simulated mapping faults into
 * the Kernel, by one of two fault paths (umbp_sim_interposer_set_fault_path):
 *   - userfaultfd (the default where the host allows it): the mappings are registered for
 *     missing-page faults; a resolver thread asks the Kernel (touch) and fills the run
 *     (UFFDIO_COPY of zeroed pages for a write, UFFDIO_ZEROPAGE for a read);
 *   - PROT_NONE: the real pages are PROT_NONE; the SIGSEGV handler asks the Kernel and makes the
 *     run accessible.
 * A child of fork() continues on the PROT_NONE path (its copies of registered mappings are not
 * registered, and the resolver thread is the parent's), with its own copy of the Kernel.
 * When the Kernel answers with a signal, the faulting thread (in the SIGSEGV handler, on both
 * paths) writes the evidence (the signal, the stage, the Kernel's crash record, reasons and
 * syscall trace: one frame, see umbp_sim_interposer_set_evidence_fd) and ends the process with
 * that real signal. Other SIGSEGVs go to the handler that was installed before
 * (Python's faulthandler). Sequential touches are granted in growing runs (up to 32 MiB,
 * reported to the Kernel as touched when granted); real memory behind simulated mappings is
 * bounded by the resident limit: past it, the pages of the oldest runs are moved (mremap) to the
 * new one or dropped (MADV_DONTNEED), so their old contents are not kept.
 */
#ifndef UMBP_SIM_INTERPOSER_H
#define UMBP_SIM_INTERPOSER_H

#include <stddef.h>
#include <stdint.h>

#include "umbp_sim/kernel.h"

#ifdef __cplusplus
extern "C" {
#endif

#define UMBP_SIM_INTERPOSER_VERSION 1
#define UMBP_SIM_INTERPOSER_API __attribute__((visibility("default")))

typedef struct umbp_sim_interposer_stats {
  unsigned long routed;   /* calls answered by the Kernel */
  unsigned long faults;   /* SIGSEGVs on simulated mappings handled */
  unsigned long moved;    /* runs whose real pages were moved (resident limit reached) */
  unsigned long resident; /* bytes of real memory behind simulated mappings */
  unsigned long mappings; /* live simulated mappings */
  unsigned long sim_fds;  /* live simulated fds */
} umbp_sim_interposer_stats;

UMBP_SIM_INTERPOSER_API int umbp_sim_interposer_version(void);
/* Route to `kernel` from now on (retains it). 0, or an errno (EINVAL: ABI version mismatch). */
UMBP_SIM_INTERPOSER_API int umbp_sim_interposer_activate(const umbp_sim_kernel* kernel);
/* Back to the real kernel for everything (releases the kernel; handlers restored). */
UMBP_SIM_INTERPOSER_API void umbp_sim_interposer_deactivate(void);
/* Calls from the loaded object at `path` (as in /proc/self/maps) are the allocator's.
 * Returns the number of executable segments registered (0: not loaded). */
UMBP_SIM_INTERPOSER_API int umbp_sim_interposer_add_caller_object(const char* path);
/* Where a simulated death's evidence goes: one frame on `fd`, a 4-byte big-endian length then
 * a JSON object {"event": "death", "signal": <number>, "stage": "page touch" | the call,
 * "kernel": the Kernel's post-mortem (umbp_sim_kernel_ops.describe 3)}. The fd is made
 * close-on-exec; a fork()ed child closes its copy (its death is not the run's); nothing is
 * written once the fd no longer names the file it named then (the process closed it). Nothing is
 * written to stderr then; with no fd (-1, the default) one line for a person goes to stderr.
 * 0, or the errno of making it close-on-exec (EBADF). */
UMBP_SIM_INTERPOSER_API int umbp_sim_interposer_set_evidence_fd(int fd);
UMBP_SIM_INTERPOSER_API void umbp_sim_interposer_enter(void);
UMBP_SIM_INTERPOSER_API void umbp_sim_interposer_leave(void);
/* Real bytes kept behind simulated mappings (default 48 MiB, at least 8 MiB; one 32 MiB block
 * is always allowed). */
UMBP_SIM_INTERPOSER_API void umbp_sim_interposer_set_resident_limit(size_t bytes);
UMBP_SIM_INTERPOSER_API void umbp_sim_interposer_get_stats(umbp_sim_interposer_stats* out);

/* Fault paths. */
#define UMBP_SIM_FAULT_PATH_NONE 0 /* (fault_path) not active, or not a simulated kernel */
#define UMBP_SIM_FAULT_PATH_AUTO 0 /* (set_fault_path) userfaultfd if it works, else SIGSEGV */
#define UMBP_SIM_FAULT_PATH_SIGSEGV 1
#define UMBP_SIM_FAULT_PATH_UFFD 2
/* The fault path the next activate() uses. 0, or EINVAL. With UMBP_SIM_FAULT_PATH_UFFD,
 * activate() fails with EOPNOTSUPP when userfaultfd does not work here. */
UMBP_SIM_INTERPOSER_API int umbp_sim_interposer_set_fault_path(int path);
/* The active fault path (UMBP_SIM_FAULT_PATH_*). */
UMBP_SIM_INTERPOSER_API int umbp_sim_interposer_fault_path(void);
/* Probes userfaultfd: 0 if it works here, else the length of why not, written to buf. */
UMBP_SIM_INTERPOSER_API size_t umbp_sim_interposer_uffd_unavailable(char* buf, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* UMBP_SIM_INTERPOSER_H */
