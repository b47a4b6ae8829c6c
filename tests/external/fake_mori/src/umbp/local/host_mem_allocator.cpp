// A stand-in for a mori checkout's allocator (tests/external/test_build_mori.py): anonymous
// 4 KiB-page buffers only. -DFAKE_MORI_UNDEFINED references a symbol nothing defines, as a
// build that misses a library does.
#include "umbp/local/host_mem_allocator.h"

#include <sys/mman.h>

#include "mori/utils/mori_log.hpp"

#ifdef FAKE_MORI_UNDEFINED
namespace fmt {
int missing_vformat(int);
}
#endif

namespace mori::umbp {

HostBufferHandle HostMemAllocator::Alloc(size_t size, const HostBufferOptions& opts) {
  HostBufferHandle h;
  if (size == 0) return h;
  const size_t mapped = (size + 4095) / 4096 * 4096;
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return h;
#ifdef FAKE_MORI_UNDEFINED
  if (fmt::missing_vformat(opts.numa_node) < 0) return h;
#endif
  if (opts.prefault) madvise(p, mapped, MADV_WILLNEED);
  h.ptr = p;
  h.requested_size = size;
  h.mapped_size = mapped;
  h.actual_alignment = 4096;
  FAKE_MORI_LOG("alloc");
  return h;
}

void HostMemAllocator::Free(HostBufferHandle& handle) {
  if (handle.ptr != nullptr) munmap(handle.ptr, handle.mapped_size);
  handle = HostBufferHandle{};
}

}  // namespace mori::umbp
