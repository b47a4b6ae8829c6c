#include "kernel/user_memory.h"

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace umbp {

namespace {

// write() copies from the caller's memory in the kernel: EFAULT where it cannot. Chunks of a
// page fit an empty pipe, so nothing blocks.
bool read_through_pipe(const void* src, void* dst, size_t n) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return false;
  const char* from = static_cast<const char*>(src);
  char* to = static_cast<char*>(dst);
  bool ok = true;
  for (size_t done = 0; ok && done < n;) {
    const size_t chunk = std::min<size_t>(n - done, 4096);
    const ssize_t w = ::write(fds[1], from + done, chunk);
    if (w <= 0) {
      ok = false;
      break;
    }
    for (ssize_t got = 0; got < w;) {
      const ssize_t r = ::read(fds[0], to + done + got, static_cast<size_t>(w - got));
      if (r <= 0) {
        ok = false;
        break;
      }
      got += r;
    }
    done += static_cast<size_t>(w);
  }
  ::close(fds[0]);
  ::close(fds[1]);
  return ok;
}

}  // namespace

bool read_user_memory(const void* src, void* dst, size_t n) {
  if (n == 0) return true;
  if (src == nullptr) return false;
  const int saved = errno;
  iovec local{dst, n};
  iovec remote{const_cast<void*>(src), n};
  const ssize_t r = ::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0);
  bool ok;
  if (r == static_cast<ssize_t>(n)) {
    ok = true;
  } else if (r >= 0 || errno == EFAULT) {
    ok = false;  // a short read stops at the first byte that cannot be read
  } else {
    ok = read_through_pipe(src, dst, n);  // process_vm_readv refused (seccomp, no CMA)
  }
  errno = saved;
  return ok;
}

}  // namespace umbp
