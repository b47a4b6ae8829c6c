// One Alloc call's steps (alloc_run.cpp), run by HostMemAllocator::Alloc.
#pragma once

#include <cstddef>

#include "allocator/host_mem_allocator.h"

namespace umbp {

// Map, bind, prefault and register one buffer; an invalid handle when the call fails (or the
// process died in a kernel call). Exceptions escape (Alloc decides what to do with them).
HostBufferHandle RunAlloc(HostMemAllocator& a, size_t size, HostBufferBacking backing, size_t hp,
                          int node, bool prefault);

}  // namespace umbp
