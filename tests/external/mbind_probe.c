/* mbind(2) as an allocator calls it, for tests/external/test_interposer_scope.py: registered as
 * a caller object, its calls inside the interposer's scope reach the Kernel. Returns 0 or the
 * errno, never -1. */
#define _GNU_SOURCE
#include <errno.h>
#include <sys/syscall.h>
#include <unistd.h>

int probe_mbind(void* addr, unsigned long len, int mode, const unsigned long* mask,
                unsigned long maxnode, unsigned flags) {
  errno = 0;
  long rc = syscall(SYS_mbind, addr, len, mode, mask, maxnode, flags);
  return rc == 0 ? 0 : errno;
}
