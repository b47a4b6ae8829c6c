// A stand-in for a mori checkout's allocator (tests/external/test_build_mori.py): 4 KiB-page
// buffers, anonymous or memfd-backed (kAnonymousShm and its hugetlb request), and mori's shm
// registry: a Free while registrations hold the buffer defers its munmap and close to the last
// ReleaseShmAllocation. -DFAKE_MORI_UNDEFINED references a symbol nothing defines, as a build
// that misses a library does; -DFAKE_MORI_REFCOUNT_BUG makes Acquire forget to count (a
// registry bug umbp-sim's steps must catch); -DFAKE_MORI_RECORDS_REQUESTED_SIZE registers the
// requested size, not the mapped one (a bug every compared run of an unaligned shm size shows),
// -DFAKE_MORI_RECORDS_NO_FD registers no fd (-1: the memfd a registration hands out is lost).
// Free clears the handle's ptr and sizes and keeps its backing and alignment, as mori's does;
// -DFAKE_MORI_FREE_RESETS_HANDLE resets the whole handle instead (backing and alignment lost), and
// -DFAKE_MORI_STALE_FAILED_HANDLE fills in the backing and alignment before mapping, so a failed
// alloc returns an invalid handle that still carries them (stale: no buffer has them);
// -DFAKE_MORI_LEAKS_FD keeps the memfd open when its mmap fails (a failure path's lost close).
#include "umbp/local/host_mem_allocator.h"

#include <sys/mman.h>
#include <unistd.h>

#include <map>
#include <mutex>

#include "mori/utils/mori_log.hpp"

#ifdef FAKE_MORI_UNDEFINED
namespace fmt {
int missing_vformat(int);
}
#endif

namespace mori::umbp {

namespace {

struct Record {
  size_t mapped = 0;
  int fd = -1;
  int holders = 0;
  bool freed = false;  // Free came while holders > 0
};

std::mutex registry_mu;
std::map<uintptr_t, Record> registry;  // by base address

// The live record whose buffer holds [ptr, ptr + size), or registry.end().
std::map<uintptr_t, Record>::iterator Containing(uintptr_t ptr, size_t size) {
  auto it = registry.upper_bound(ptr);
  if (it == registry.begin()) return registry.end();
  --it;
  if (it->second.freed || size > it->second.mapped || ptr - it->first > it->second.mapped - size)
    return registry.end();
  return it;
}

// What Free leaves of a handle.
void Invalidate(HostBufferHandle& h) {
#ifdef FAKE_MORI_FREE_RESETS_HANDLE
  h = HostBufferHandle{};
#else
  h.ptr = nullptr;
  h.requested_size = 0;
  h.mapped_size = 0;
#endif
}

bool IsShm(HostBufferBacking b) {
  return b == HostBufferBacking::kAnonymousShm || b == HostBufferBacking::kAnonymousShmHugetlb;
}

}  // namespace

HostBufferHandle HostMemAllocator::Alloc(size_t size, const HostBufferOptions& opts) {
  HostBufferHandle h;
  if (size == 0) return h;
  const size_t mapped = (size + 4095) / 4096 * 4096;
  const bool shm = IsShm(opts.backing);
  int fd = -1;
#ifdef FAKE_MORI_STALE_FAILED_HANDLE
  h.actual_backing = shm ? HostBufferBacking::kAnonymousShm : HostBufferBacking::kAnonymous;
  h.actual_alignment = 4096;
#endif
  if (shm) {
    fd = memfd_create("fake-mori", MFD_CLOEXEC);
    if (fd < 0) return h;
    if (ftruncate(fd, static_cast<off_t>(mapped)) != 0) {
      close(fd);
      return h;
    }
  }
  void* p = shm ? mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                : mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
#ifndef FAKE_MORI_LEAKS_FD
    if (fd >= 0) close(fd);
#endif
    return h;
  }
#ifdef FAKE_MORI_UNDEFINED
  if (fmt::missing_vformat(opts.numa_node) < 0) return h;
#endif
  if (opts.prefault) madvise(p, mapped, MADV_WILLNEED);
  h.ptr = p;
  h.requested_size = size;
  h.mapped_size = mapped;
  h.actual_alignment = 4096;
  if (shm) {
    h.actual_backing = HostBufferBacking::kAnonymousShm;
    std::lock_guard<std::mutex> lock(registry_mu);
#if defined(FAKE_MORI_RECORDS_REQUESTED_SIZE)
    registry[reinterpret_cast<uintptr_t>(p)] = Record{size, fd, 0, false};
#elif defined(FAKE_MORI_RECORDS_NO_FD)
    registry[reinterpret_cast<uintptr_t>(p)] = Record{mapped, -1, 0, false};
#else
    registry[reinterpret_cast<uintptr_t>(p)] = Record{mapped, fd, 0, false};
#endif
  }
  FAKE_MORI_LOG("alloc");
  return h;
}

void HostMemAllocator::Free(HostBufferHandle& handle) {
  if (handle.ptr == nullptr) return;
  int fd = -1;
  if (IsShm(handle.actual_backing)) {
    std::lock_guard<std::mutex> lock(registry_mu);
    auto it = registry.find(reinterpret_cast<uintptr_t>(handle.ptr));
    if (it != registry.end()) {
      if (it->second.holders > 0) {
        it->second.freed = true;  // the last release unmaps and closes
        Invalidate(handle);
        return;
      }
      fd = it->second.fd;
      registry.erase(it);
    }
  }
  void* const ptr = handle.ptr;
  const size_t len = handle.mapped_size;
  Invalidate(handle);
  munmap(ptr, len);
  if (fd >= 0) close(fd);
}

std::optional<HostMemAllocator::ShmAllocation> HostMemAllocator::LookupShmAllocation(uintptr_t ptr,
                                                                                     size_t size) {
  std::lock_guard<std::mutex> lock(registry_mu);
  auto it = Containing(ptr, size);
  if (it == registry.end()) return std::nullopt;
  return ShmAllocation{reinterpret_cast<void*>(it->first), it->second.mapped, it->second.fd};
}

std::optional<HostMemAllocator::ShmAllocation> HostMemAllocator::AcquireShmAllocation(uintptr_t ptr,
                                                                                      size_t size) {
  std::lock_guard<std::mutex> lock(registry_mu);
  auto it = Containing(ptr, size);
  if (it == registry.end()) return std::nullopt;
#ifndef FAKE_MORI_REFCOUNT_BUG
  ++it->second.holders;
#endif
  return ShmAllocation{reinterpret_cast<void*>(it->first), it->second.mapped, it->second.fd};
}

void HostMemAllocator::ReleaseShmAllocation(uintptr_t base) {
  Record done;
  {
    std::lock_guard<std::mutex> lock(registry_mu);
    auto it = registry.find(base);
    if (it == registry.end() || it->second.holders == 0) return;
    if (--it->second.holders > 0 || !it->second.freed) return;
    done = it->second;
    registry.erase(it);
  }
  munmap(reinterpret_cast<void*>(base), done.mapped);
  if (done.fd >= 0) close(done.fd);
}

}  // namespace mori::umbp
