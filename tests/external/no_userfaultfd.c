/* A host without userfaultfd, for tests: preloaded after the interposer, this syscall() is the
 * one the interposer reaches (dlsym RTLD_NEXT). userfaultfd(2) fails with ENOSYS and opening
 * /dev/userfaultfd with ENOENT; every other call goes on to libc. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <string.h>
#include <sys/syscall.h>

long syscall(long nr, ...) {
  va_list ap;
  va_start(ap, nr);
  long a[6];
  for (int i = 0; i < 6; ++i) a[i] = va_arg(ap, long);
  va_end(ap);
  if (nr == SYS_userfaultfd) {
    errno = ENOSYS;
    return -1;
  }
  if (nr == SYS_openat && a[1] && strcmp((const char*)a[1], "/dev/userfaultfd") == 0) {
    errno = ENOENT;
    return -1;
  }
  long (*next)(long, ...) = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
  return next(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
}
