/* umbp-sim's kernel seam as a C ABI (installed with the wheel: umbp_sim.get_include()).
 *
 * A umbp_sim_kernel is any Kernel of umbp-sim (LinuxKernel, SimKernel, FaultyKernel,
 * TracingKernel, or a stack of them) seen from C: a table of functions and the object they act
 * on. Python hands one to C as a capsule named UMBP_SIM_KERNEL_CAPSULE
 * (`umbp_sim.capi.kernel_capsule(kernel)`); the capsule owns a reference to the kernel.
 *
 * Every call returns a umbp_sim_result, Linux's own convention made explicit:
 *   success:         error == 0, signal == 0, value = what the syscall returns
 *                    (the address for mmap, the fd for memfd_create, 0 otherwise);
 *   failure:         value == -1, error = the errno the syscall would set;
 *   simulated crash: signal != 0 (SIGBUS on a hugetlb fault, SIGKILL for an OOM kill): the
 *                    calling process is dead; stop issuing calls.
 * Arguments are exactly the syscall's: mbind takes the raw nodemask and maxnode (the kernel
 * reads maxnode-1 bits), flags and errno values are the Linux UAPI ones.
 *
 * Thread-safe: every kernel may be called from any thread.
 */
#ifndef UMBP_SIM_KERNEL_H
#define UMBP_SIM_KERNEL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define UMBP_SIM_KERNEL_ABI_VERSION 1u
#define UMBP_SIM_KERNEL_CAPSULE "umbp_sim.kernel"

/* umbp_sim_kernel_ops.flags */
#define UMBP_SIM_KERNEL_SIMULATED 1u  /* mappings are simulated: their pages are not real memory */
#define UMBP_SIM_KERNEL_CALL_SITES 2u /* the ops table has set_call_site */

typedef struct umbp_sim_result {
  long value;
  int error;  /* errno, 0 on success */
  int signal; /* simulated fatal signal, 0 if none */
} umbp_sim_result;

typedef struct umbp_sim_kernel_ops {
  unsigned abi_version; /* UMBP_SIM_KERNEL_ABI_VERSION */
  unsigned flags;       /* UMBP_SIM_KERNEL_* */
  /* sysconf(_SC_PAGESIZE) */
  size_t (*page_size)(void* self);
  umbp_sim_result (*mmap)(void* self, void* addr, size_t length, int prot, int flags, int fd,
                          long offset);
  umbp_sim_result (*munmap)(void* self, void* addr, size_t length);
  umbp_sim_result (*madvise)(void* self, void* addr, size_t length, int advice);
  umbp_sim_result (*mbind)(void* self, void* addr, size_t length, int mode,
                           const unsigned long* nodemask, unsigned long maxnode, unsigned flags);
  umbp_sim_result (*memfd_create)(void* self, const char* name, unsigned flags);
  umbp_sim_result (*ftruncate)(void* self, int fd, long length);
  umbp_sim_result (*close)(void* self, int fd);
  /* Whole contents of a /proc or /sys file. Success: value = length, *data = a malloc'd,
   * NUL-terminated copy the caller frees with free(). Failure: value -1, error (ENOENT...). */
  umbp_sim_result (*read_file)(void* self, const char* path, char** data);
  /* Write one byte at addr, addr+stride, ... below addr+length (page faults), as accounting
   * for a simulated kernel: no real memory is written. */
  umbp_sim_result (*touch)(void* self, void* addr, size_t length, size_t stride);
  /* End address of the mapping containing addr, 0 if none (or unknown: a real kernel). */
  unsigned long (*mapping_end)(void* self, void* addr);
  /* Text for a post-mortem, written to buf (at most cap-1 bytes, NUL-terminated); returns the
   * full length. what: 0 = the simulated crash ("SIGBUS in prefault touch (node 1, 2048 kB
   * pages): no free ..."; node and page size when known), empty if
   * none; 1 = the syscall trace of the TracingKernel in the stack, empty if none; 2 = the
   * SimKernel's recorded reasons, one JSON object a line ({"call", "rule", "errno", "signal",
   * "numbers", "text"}), empty if none or not simulated; 3 = the post-mortem as one JSON object
   * (what the interposer hands umbp-sim when the process dies): {"crash": null or {"signal",
   * "where", "node", "hugepage_size", "detail", "text"} (node and hugepage_size null when
   * unknown, text as 0 gives it), "reasons": [the objects of 2], "trace": [the lines of 1],
   * "sites": [each line's call site: an index in call_sites, -1 none], "call_sites": [[object
   * path, offset], ...]: set_call_site's}. */
  size_t (*describe)(void* self, int what, char* buf, size_t cap);
  void (*retain)(void* self);
  void (*release)(void* self);
  /* The NUMA node of the page at addr, as move_pages(2) reports it in query mode (nodes NULL):
   * the node (>= 0) when the page is faulted, -ENOENT when it is not, -EFAULT outside every
   * mapping; -ENOSYS from a kernel that is not simulated. (Fields are only ever appended.) */
  int (*page_node)(void* self, void* addr);
  /* (Present when flags has UMBP_SIM_KERNEL_CALL_SITES.) Where this thread's next call through
   * the table comes from: the loaded object's path (as dladdr names it) and the offset of the
   * call's return address minus one from the object's load base. A TracingKernel in the stack
   * records it with the call; it is cleared when that call returns. NULL object: unknown. */
  void (*set_call_site)(void* self, const char* object, unsigned long offset);
} umbp_sim_kernel_ops;

typedef struct umbp_sim_kernel {
  const umbp_sim_kernel_ops* ops;
  void* self;
} umbp_sim_kernel;

/* One function per call. */
static inline size_t umbp_sim_page_size(const umbp_sim_kernel* k) {
  return k->ops->page_size(k->self);
}
static inline umbp_sim_result umbp_sim_mmap(const umbp_sim_kernel* k, void* addr, size_t length,
                                            int prot, int flags, int fd, long offset) {
  return k->ops->mmap(k->self, addr, length, prot, flags, fd, offset);
}
static inline umbp_sim_result umbp_sim_munmap(const umbp_sim_kernel* k, void* addr, size_t length) {
  return k->ops->munmap(k->self, addr, length);
}
static inline umbp_sim_result umbp_sim_madvise(const umbp_sim_kernel* k, void* addr, size_t length,
                                               int advice) {
  return k->ops->madvise(k->self, addr, length, advice);
}
static inline umbp_sim_result umbp_sim_mbind(const umbp_sim_kernel* k, void* addr, size_t length,
                                             int mode, const unsigned long* nodemask,
                                             unsigned long maxnode, unsigned flags) {
  return k->ops->mbind(k->self, addr, length, mode, nodemask, maxnode, flags);
}
static inline umbp_sim_result umbp_sim_memfd_create(const umbp_sim_kernel* k, const char* name,
                                                    unsigned flags) {
  return k->ops->memfd_create(k->self, name, flags);
}
static inline umbp_sim_result umbp_sim_ftruncate(const umbp_sim_kernel* k, int fd, long length) {
  return k->ops->ftruncate(k->self, fd, length);
}
static inline umbp_sim_result umbp_sim_close(const umbp_sim_kernel* k, int fd) {
  return k->ops->close(k->self, fd);
}
static inline umbp_sim_result umbp_sim_read_file(const umbp_sim_kernel* k, const char* path,
                                                 char** data) {
  return k->ops->read_file(k->self, path, data);
}
static inline umbp_sim_result umbp_sim_touch(const umbp_sim_kernel* k, void* addr, size_t length,
                                             size_t stride) {
  return k->ops->touch(k->self, addr, length, stride);
}

#ifdef Py_PYTHON_H
/* The kernel inside a capsule from umbp_sim.capi.kernel_capsule(); NULL with a Python error set
 * if `capsule` is not one. Valid while the capsule lives. */
static inline const umbp_sim_kernel* umbp_sim_kernel_from_capsule(PyObject* capsule) {
  return (const umbp_sim_kernel*)PyCapsule_GetPointer(capsule, UMBP_SIM_KERNEL_CAPSULE);
}
#endif

#ifdef __cplusplus
}
#endif

#endif /* UMBP_SIM_KERNEL_H */
