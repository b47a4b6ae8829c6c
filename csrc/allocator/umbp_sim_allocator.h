// umbp-sim's allocator: mori's HostMemAllocator with umbp-sim's fixes, the reference for what a
// fixed allocator would do. Where it parts from mori, row by row: docs/deployed-behaviour.md.
//
// Its promises beyond mori's: it never throws (every resource a failed call took, mapping or
// memfd, is released, also when a kernel call throws); a hugetlb step that fails demotes with a
// warning once per (backing, step, size, errno) that names the size's counters; a failed
// MADV_POPULATE_WRITE unmaps (and demotes on hugetlb EFAULT, where touching would be SIGBUS);
// it binds only nodes that /sys/devices/system/node/possible lists; Free trusts its own table,
// not the handle (a stale copy is refused).
#pragma once

#include "allocator/host_mem_allocator.h"

namespace umbp {

class UmbpSimAllocator final : public HostMemAllocator {
 public:
  explicit UmbpSimAllocator(KernelPtr kernel, LogSink sink = {});

  HostBufferHandle Alloc(size_t size, HostBufferBacking backing, size_t hugepage_size,
                         int numa_node, bool prefault) override;
  void Free(HostBufferHandle& handle) override;
  void ReleaseShmAllocation(uintptr_t base) override;

 private:
  void CloseOrphans();
  // After the munmap of a buffer: a failure is warned, then the memfd (fd >= 0) is closed. A
  // process that died in the munmap does nothing more.
  void Unmapped(const SysResult& r, void* ptr, size_t len, int fd, const texts::Warning& failed);
  void CloseOwned(int fd, void* ptr);
};

}  // namespace umbp
