// HostMemAllocator: the UMBP host-buffer allocator's API (mori's umbp::HostMemAllocator),
// standing on the Kernel seam. Production code: every OS call goes through Kernel&, nothing here
// knows whether the kernel is real, simulated or fault-injecting.
//
// Two built-in allocators implement it, each in its own file over one support layer
// (allocator_support.h: the process's tables, nodemask memory, orphan fds):
//
//   UmbpSimAllocator      umbp_sim_allocator.cpp: mori's allocator with umbp-sim's fixes (the
//                         reference for "what a fixed allocator would do");
//   Mori624002cAllocator  mori_624002c_allocator.cpp: a model of mori's HostMemAllocator at
//                         ROCm/mori commit 624002c (2026-08-21), its steps in mori's order with
//                         the lines of src/umbp/local/host_mem_allocator.cpp each reproduces: the
//                         allocator of the servers in the field (docs/deployed-behaviour.md).
//
// Python names them by profile (umbp_sim/allocator_profiles.py); `umbp-sim profiles` lists where
// they differ.
//
// Per-kernel state: the table of live buffers, the shm registry and which once-only warnings were
// given belong to the Kernel instance (one "process"), shared by every allocator built on it and
// kept after the last allocator is gone, as mori's registry and once flags are process-wide. Any
// allocator on the same kernel can free or look up another one's buffers.
//
// A kernel call that kills the process (SysResult::killed(), a simulated SIGBUS or OOM kill)
// ends the call: no further kernel call, an invalid handle. Which signal and where is recorded
// by the kernel that raised it, not here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "allocator/allocator_support.h"
#include "allocator/host_buffer.h"
#include "kernel/kernel.h"

namespace umbp {

class HostMemAllocator {
 public:
  struct ShmAllocation {
    void* base = nullptr;
    size_t mapped_size = 0;
    int fd = -1;  // owned by the registry: pass it on (SCM_RIGHTS), never close it
  };

  virtual ~HostMemAllocator();
  HostMemAllocator(const HostMemAllocator&) = delete;
  HostMemAllocator& operator=(const HostMemAllocator&) = delete;

  // Invalid handle on failure; a hugetlb backing that cannot be had is demoted
  // (AnonymousHugetlb -> Anonymous, AnonymousShmHugetlb -> AnonymousShm) with a warning.
  virtual HostBufferHandle Alloc(size_t size, HostBufferBacking backing, size_t hugepage_size,
                                 int numa_node, bool prefault) = 0;

  // Idempotent. Invalidates the handle in place (ptr, requested_size, mapped_size zeroed, fd -1)
  // even when munmap fails. A handle of another kernel is left untouched and nothing is unmapped
  // (warning), in both allocators.
  virtual void Free(HostBufferHandle& handle) = 0;

  // mori's registry: the live shm allocation containing [ptr, ptr + size), if any.
  std::optional<ShmAllocation> LookupShmAllocation(uintptr_t ptr, size_t size);
  // Same, and counts one more active registration (Free then defers munmap/close).
  std::optional<ShmAllocation> AcquireShmAllocation(uintptr_t ptr, size_t size);
  // Drops one registration of the allocation based at `base`; the last one after a Free
  // unmaps and closes.
  virtual void ReleaseShmAllocation(uintptr_t base) = 0;

  // The allocator's own bookkeeping, shared by every allocator on this kernel, by address: the
  // buffers Alloc returned and Free has not taken back, and the shm registry's records (with
  // their active registrations and deferred frees). What the process holds at the kernel is a
  // kernel wrapper's to say (kernel/leak_ledger.h), not the allocator's.
  std::vector<LiveBuffer> LiveBuffers() const;
  std::vector<ShmRegistryEntry> ShmRegistry() const;

  const KernelPtr& kernel() const { return support_.kernel_ptr(); }

 protected:
  HostMemAllocator(KernelPtr kernel, LogSink sink);

  // Drops one registration of the record at `base` (mori 552-562). What is left to unmap and
  // close when it was the last one after a Free; a status when the release matched nothing.
  struct Released {
    enum { kOk, kUnknown, kUnmatched } status = kOk;
    void* ptr = nullptr;
    size_t len = 0;
    int fd = -1;
  };
  Released DropRegistration(uintptr_t base);

  AllocatorSupport support_;
};

}  // namespace umbp
