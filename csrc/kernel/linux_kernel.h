// LinuxKernel: the seam passed straight through to the running kernel.
#pragma once

#include "kernel/kernel.h"

namespace umbp {

class LinuxKernel final : public Kernel {
 public:
  size_t page_size() override;
  SysResult mmap(void* addr, size_t length, int prot, int flags, int fd, off_t offset) override;
  SysResult munmap(void* addr, size_t length) override;
  SysResult madvise(void* addr, size_t length, int advice) override;
  SysResult mbind(void* addr, size_t length, int mode, const unsigned long* nodemask,
                  unsigned long maxnode, unsigned flags) override;
  SysResult memfd_create(const char* name, unsigned flags) override;
  SysResult ftruncate(int fd, off_t length) override;
  SysResult close(int fd) override;
  FileResult read_file(const std::string& path) override;
  SysResult touch(void* addr, size_t length, size_t stride) override;
};

}  // namespace umbp
