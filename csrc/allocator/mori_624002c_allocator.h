// A model of mori's HostMemAllocator at ROCm/mori commit 624002c (2026-08-21),
// src/umbp/local/host_mem_allocator.cpp: the allocator of the servers in the field. Its control
// flow follows mori's from top to bottom (one function per backing, the fallback to the base-page
// backing, the post-mapping policies, Free and the registry), each step commented with the mori
// lines it reproduces; its texts are mori's MORI_UMBP_WARN lines (warning_texts.h). Measured
// against a build of mori itself: docs/deployed-behaviour.md, and `umbp-sim compare`.
//
// Like mori it throws: a nodemask that cannot be allocated is std::bad_alloc out of Alloc, with
// the mapping left behind. What mori gets from the process (the registry's storage, malloc,
// the table of live buffers a harness keeps) is the support layer's (allocator_support.h).
#pragma once

#include "allocator/host_mem_allocator.h"

namespace umbp {

class Mori624002cAllocator final : public HostMemAllocator {
 public:
  explicit Mori624002cAllocator(KernelPtr kernel, LogSink sink = {});

  HostBufferHandle Alloc(size_t size, HostBufferBacking backing, size_t hugepage_size,
                         int numa_node, bool prefault) override;
  void Free(HostBufferHandle& handle) override;
  void ReleaseShmAllocation(uintptr_t base) override;

 private:
  void CloseOrphans();
};

}  // namespace umbp
