#include "kernel/linux_kernel.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

namespace umbp {

namespace {
SysResult from_ret(long ret) { return ret == -1 ? SysResult::Err(errno) : SysResult::Ok(ret); }
}  // namespace

size_t LinuxKernel::page_size() {
  long ps = ::sysconf(_SC_PAGESIZE);
  return ps > 0 ? static_cast<size_t>(ps) : 4096;
}

SysResult LinuxKernel::mmap(void* addr, size_t length, int prot, int flags, int fd, off_t offset) {
  void* p = ::mmap(addr, length, prot, flags, fd, offset);
  if (p == MAP_FAILED) return SysResult::Err(errno);
  return SysResult::Ok(static_cast<long>(reinterpret_cast<uintptr_t>(p)));
}

SysResult LinuxKernel::munmap(void* addr, size_t length) {
  return from_ret(::munmap(addr, length));
}

SysResult LinuxKernel::madvise(void* addr, size_t length, int advice) {
  return from_ret(::madvise(addr, length, advice));
}

// Raw syscalls: no libnuma, and glibc's memfd_create wrapper is missing on old C libraries.
SysResult LinuxKernel::mbind(void* addr, size_t length, int mode, const unsigned long* nodemask,
                             unsigned long maxnode, unsigned flags) {
  return from_ret(::syscall(SYS_mbind, addr, length, mode, nodemask, maxnode, flags));
}

SysResult LinuxKernel::memfd_create(const char* name, unsigned flags) {
  return from_ret(::syscall(SYS_memfd_create, name, flags));
}

SysResult LinuxKernel::ftruncate(int fd, off_t length) { return from_ret(::ftruncate(fd, length)); }

SysResult LinuxKernel::close(int fd) { return from_ret(::close(fd)); }

FileResult LinuxKernel::read_file(const std::string& path) {
  FileResult r;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    r.error = errno;
    return r;
  }
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      r.data.append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      break;
    } else if (errno != EINTR) {
      r.error = errno;
      r.data.clear();
      break;
    }
  }
  ::close(fd);
  return r;
}

SysResult LinuxKernel::touch(void* addr, size_t length, size_t stride) {
  if (stride == 0) return SysResult::Err(EINVAL);
  auto* p = static_cast<volatile char*>(addr);
  for (size_t off = 0; off < length; off += stride) p[off] = 0;
  return SysResult::Ok();
}

}  // namespace umbp
