// The model of mori's HostMemAllocator at 624002c (mori_624002c_allocator.h). Read it beside
// mori's src/umbp/local/host_mem_allocator.cpp: the functions come in mori's order and each step
// names the mori lines it reproduces ("mori N-M"). Built as mori is against current headers:
// MADV_POPULATE_WRITE, MAP_HUGETLB, MFD_HUGETLB, MAP_HUGE_SHIFT and __NR_mbind are all defined,
// so the #else branches of mori's #ifdefs are not modelled.
//
// Where the model adds to mori, it says so: a process that dies in a kernel call (a simulated
// SIGBUS or OOM kill) ends the call with no further kernel call; the live table, serials and
// orphan fds are the harness's (allocator_support.h).
#include "allocator/mori_624002c_allocator.h"

#include <fcntl.h>
#include <linux/memfd.h>
#include <linux/mempolicy.h>
#include <sys/mman.h>

#include <cerrno>
#include <climits>
#include <mutex>

#include "allocator/allocator_format.h"
#include "allocator/host_files.h"
#include "allocator/warning_texts.h"

namespace umbp {

namespace {

using texts::Fill;

constexpr int kMadvPopulateWrite = 23;  // MADV_POPULATE_WRITE (Linux 5.14)

// mori's HostBufferOptions: what Alloc was asked besides the size.
struct Options {
  HostBufferBacking backing;
  size_t hugepage_size;
  int numa_node;
  bool prefault;
};

// One Alloc call: mori's free functions, on the call's kernel. died(): the process was killed in
// a kernel call; every function then returns an invalid handle at once.
class MoriAlloc {
 public:
  MoriAlloc(AllocatorSupport& s, const Options& opts)
      : s_(s), k_(s.kernel()), page_(k_.page_size()), opts_(opts) {}

  // mori 126-135: one std::once_flag for every hugetlb fallback of the process (both backings,
  // every size and errno), used up even when the log level drops the line. The counters are
  // /proc/meminfo's, i.e. the default hugepage size's (mori 106-124).
  void LogHugepageFallbackOnce(size_t size, size_t hugepage_size, int err) {
    s_.WarnOnce("mori:hugetlb-fallback", texts::kMoriHugetlbFallback, [&] {
      return Fill(texts::kMoriHugetlbFallback, {{"n", std::to_string(size)},
                                                {"hp", std::to_string(hugepage_size)},
                                                {"err", MoriErr(err)},
                                                {"meminfo", MoriMeminfoSummary(k_)}});
    });
  }

  // mori 137-142
  void LogNumaUnavailableOnce() {
    s_.WarnOnce("mori:numa-unavailable", texts::kMoriNumaUnavailable,
                [] { return std::string(texts::kMoriNumaUnavailable.text); });
  }

  // mori 151-164, with TouchPages (144-149) one touch per stride. Whatever madvise's errno, the
  // pages are touched by hand: on hugetlb with no page on the node, that is the SIGBUS.
  void PrefaultPages(void* ptr, size_t mapped_size, size_t stride) {
    SysResult r = k_.madvise(ptr, mapped_size, kMadvPopulateWrite);  // mori 155
    if (Died(r) || r.ok()) return;
    s_.Warn(texts::kMoriPopulateFailed, {{"err", MoriErr(r.error)}});  // mori 156-160
    Died(k_.touch(ptr, mapped_size, stride));                          // mori 163
  }

  // mori 167-187: 0 or -errno. The nodemask is numa_node/64+1 words (256 MiB for 2^31-1), its
  // memory taken as malloc would (the support layer's MaskMemory: std::bad_alloc escapes Alloc
  // when refused, with the mapping left behind); maxnode is the mask's bit count, so the kernel,
  // which reads maxnode - 1 bits, drops node 63 (mod 64).
  int MbindMemory(void* ptr, size_t mapped_size, int numa_node) {
    constexpr size_t kBitsPerWord = sizeof(unsigned long) * CHAR_BIT;  // mori 171
    const size_t node = static_cast<size_t>(numa_node);
    const size_t word_count = node / kBitsPerWord + 1;  // mori 172
    AllocatorSupport::MaskMemory nodemask(k_, word_count);
    nodemask.data()[node / kBitsPerWord] = 1UL << (node % kBitsPerWord);  // mori 173-175
    SysResult r = k_.mbind(ptr, mapped_size, MPOL_BIND, nodemask.data(),
                           static_cast<unsigned long>(word_count * kBitsPerWord), 0);  // 177-178
    if (Died(r)) return 0;
    return r.ok() ? 0 : -r.error;  // mori 179-180
  }

  // mori 197-216: bind (a failure is only warned), then prefault.
  void ApplyPostMappingPolicies(HostBufferHandle& handle) {
    if (opts_.numa_node >= 0) {  // mori 200-208
      const int rc = MbindMemory(handle.ptr, handle.mapped_size, opts_.numa_node);
      if (died_) return;
      if (rc == -ENOSYS) {
        LogNumaUnavailableOnce();
      } else if (rc != 0) {
        s_.Warn(texts::kMoriMbindFailed,
                {{"node", std::to_string(opts_.numa_node)}, {"err", MoriErr(-rc)}});
      } else {
        handle.numa_node = opts_.numa_node;  // the model's handle says where it is bound
      }
    }
    if (opts_.prefault) {  // mori 210-215
      const size_t stride = IsHugetlb(handle.actual_backing) ? handle.actual_alignment : page_;
      PrefaultPages(handle.ptr, handle.mapped_size, stride);
    }
  }

  // mori 228-247
  HostBufferHandle AllocAnonymous(size_t size) {
    if (size == 0) return {};                                        // mori 230
    const std::optional<size_t> mapped_size = AlignUp(size, page_);  // mori 232-234
    if (!mapped_size) return {};
    SysResult r = k_.mmap(nullptr, *mapped_size, PROT_READ | PROT_WRITE,
                          MAP_ANONYMOUS | MAP_PRIVATE, -1, 0);  // mori 236-238, silently
    if (Died(r) || !r.ok()) return {};
    HostBufferHandle handle = Handle(r.ptr(), size, *mapped_size, HostBufferBacking::Anonymous,
                                     page_);  // mori 240-244
    ApplyPostMappingPolicies(handle);         // mori 245
    if (died_) return {};
    return s_.Record(handle);  // the harness's live table (mori keeps none for this backing)
  }

  // mori 249-298
  HostBufferHandle AllocAnonymousShm(size_t size) {
    if (size == 0) return {};                                        // mori 251
    const std::optional<size_t> mapped_size = AlignUp(size, page_);  // mori 253-255
    if (!mapped_size) return {};
    SysResult fd = k_.memfd_create("umbp_host_buffer", MFD_CLOEXEC);  // mori 257-262
    if (Died(fd)) return {};
    if (!fd.ok()) {
      s_.Warn(texts::kMoriMemfdFailed, {{"err", MoriErr(fd.error)}});
      return {};
    }
    const int memfd = static_cast<int>(fd.value);
    SysResult t = k_.ftruncate(memfd, static_cast<off_t>(*mapped_size));  // mori 264-270
    if (Died(t)) return {};
    if (!t.ok()) {
      // The model closes before it warns (mori warns first): apart only if close kills.
      if (Died(k_.close(memfd))) return {};
      s_.Warn(texts::kMoriFtruncateFailed,
              {{"what", "memfd"}, {"n", std::to_string(*mapped_size)}, {"err", MoriErr(t.error)}});
      return {};
    }
    SysResult m = k_.mmap(nullptr, *mapped_size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd,
                          0);  // mori 272-279
    if (Died(m)) return {};
    if (!m.ok()) {
      if (Died(k_.close(memfd))) return {};  // closed first, as above
      s_.Warn(texts::kMoriMmapFailed,
              {{"n", std::to_string(*mapped_size)}, {"err", MoriErr(m.error)}});
      return {};
    }
    HostBufferHandle handle = Handle(m.ptr(), size, *mapped_size, HostBufferBacking::AnonymousShm,
                                     page_, memfd);  // mori 281-285
    handle = s_.Record(handle);        // mori 287-294: the registry record, before the policies
    ApplyPostMappingPolicies(handle);  // mori 296
    if (died_) return {};
    return handle;
  }

  // mori 304-382: falls back to AllocAnonymousShm, so the fd hand-off still works.
  HostBufferHandle AllocAnonymousShmHugetlb(size_t size) {
    const size_t hp = opts_.hugepage_size;
    if (size == 0) return {};  // mori 306
    if (!IsPowerOfTwo(hp)) {   // mori 307-314, every time
      s_.Warn(texts::kMoriInvalidHugepageSizeShm, {{"hp", std::to_string(hp)}});
      return AllocAnonymousShm(size);
    }
    // mori 316-317. A hugepage_size of 1 passes (a power of two, no MAP_HUGE bits: the default
    // size, with mapped_size == size); 2..4096 are left to the kernel to refuse.
    const std::optional<size_t> mapped_size = AlignUp(size, hp);
    if (!mapped_size) return {};
    // mori 325-343 (TryBuildHugepageFlags, 218-226, cannot fail past the power-of-two check)
    SysResult fd =
        k_.memfd_create("umbp_host_buffer_hugetlb",
                        MFD_CLOEXEC | MFD_HUGETLB | static_cast<unsigned>(HugeSizeBits(hp)));
    if (Died(fd)) return {};
    if (!fd.ok()) {
      LogHugepageFallbackOnce(size, hp, fd.error);
      return AllocAnonymousShm(size);
    }
    const int memfd = static_cast<int>(fd.value);
    SysResult t = k_.ftruncate(memfd, static_cast<off_t>(*mapped_size));  // mori 345-353
    if (Died(t)) return {};
    if (!t.ok()) {
      if (Died(k_.close(memfd))) return {};  // closed first, as in AllocAnonymousShm
      s_.Warn(texts::kMoriFtruncateFailed, {{"what", "hugetlb memfd"},
                                            {"n", std::to_string(*mapped_size)},
                                            {"err", MoriErr(t.error)}});  // every time, not once
      return AllocAnonymousShm(size);
    }
    SysResult m = k_.mmap(nullptr, *mapped_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_HUGETLB,
                          memfd, 0);  // mori 355-362
    if (Died(m)) return {};
    if (!m.ok()) {
      // The model closes before the fallback warning reads /proc/meminfo (mori 357-358 the other
      // way round): the order the traces have always shown.
      if (Died(k_.close(memfd))) return {};
      LogHugepageFallbackOnce(size, hp, m.error);
      return AllocAnonymousShm(size);
    }
    HostBufferHandle handle = Handle(m.ptr(), size, *mapped_size,
                                     HostBufferBacking::AnonymousShmHugetlb, hp, memfd);  // 364-368
    handle = s_.Record(handle);        // mori 370-377: the registry record, before the policies
    ApplyPostMappingPolicies(handle);  // mori 379
    if (died_) return {};
    return handle;
  }

  // mori 384-432
  HostBufferHandle AllocAnonymousHugetlb(size_t size) {
    const size_t hp = opts_.hugepage_size;
    if (size == 0) return {};  // mori 386
    if (!IsPowerOfTwo(hp)) {   // mori 387-393, every time
      s_.Warn(texts::kMoriInvalidHugepageSize, {{"hp", std::to_string(hp)}});
      return AllocAnonymous(size);
    }
    const std::optional<size_t> mapped_size = AlignUp(size, hp);  // mori 395-396
    if (!mapped_size) return {};
    const int flags = MAP_ANONYMOUS | MAP_PRIVATE | MAP_HUGETLB | HugeSizeBits(hp);      // 404-415
    SysResult r = k_.mmap(nullptr, *mapped_size, PROT_READ | PROT_WRITE, flags, -1, 0);  // 416
    if (Died(r)) return {};
    if (!r.ok()) {  // mori 417-422
      LogHugepageFallbackOnce(size, hp, r.error);
      return AllocAnonymous(size);
    }
    HostBufferHandle handle = Handle(r.ptr(), size, *mapped_size,
                                     HostBufferBacking::AnonymousHugetlb, hp);  // mori 424-428
    ApplyPostMappingPolicies(handle);                                           // mori 429
    if (died_) return {};
    return s_.Record(handle);  // the harness's live table
  }

 private:
  // The process was killed in this kernel call: nothing more happens in it.
  bool Died(const SysResult& r) {
    if (r.killed()) died_ = true;
    return died_;
  }

  static HostBufferHandle Handle(void* ptr, size_t size, size_t mapped_size,
                                 HostBufferBacking backing, size_t alignment, int fd = -1) {
    HostBufferHandle h;
    h.ptr = ptr;
    h.requested_size = size;
    h.mapped_size = mapped_size;
    h.actual_backing = backing;
    h.actual_alignment = alignment;
    h.fd = fd;
    return h;
  }

  AllocatorSupport& s_;
  Kernel& k_;
  size_t page_;
  Options opts_;
  bool died_ = false;
};

}  // namespace

Mori624002cAllocator::Mori624002cAllocator(KernelPtr kernel, LogSink sink)
    : HostMemAllocator(std::move(kernel), std::move(sink)) {}

void Mori624002cAllocator::CloseOrphans() {
  support_.CloseOrphans([](int, const SysResult&) {});  // mori says nothing of a failed close
}

// mori 436-449. No try/catch, as in mori: std::bad_alloc leaves Alloc.
HostBufferHandle Mori624002cAllocator::Alloc(size_t size, HostBufferBacking backing,
                                             size_t hugepage_size, int numa_node, bool prefault) {
  if (!support_.ready()) {
    support_.Warn(texts::kNoKernel);
    return {};
  }
  try {
    CloseOrphans();
  } catch (...) {
  }
  MoriAlloc call(support_, Options{backing, hugepage_size, numa_node, prefault});
  switch (backing) {
    case HostBufferBacking::Anonymous:
      return call.AllocAnonymous(size);
    case HostBufferBacking::AnonymousHugetlb:
      return call.AllocAnonymousHugetlb(size);
    case HostBufferBacking::AnonymousShm:
      return call.AllocAnonymousShm(size);
    case HostBufferBacking::AnonymousShmHugetlb:
      return call.AllocAnonymousShmHugetlb(size);
  }
  return {};  // mori 446-447: an unknown backing, silently
}

// mori 451-494: the handle is trusted, its address and size unmapped; for shm backings the
// registry record at that address is taken (a stale copy takes the record, and closes the fd, of
// whatever buffer is there now). The harness refuses only a handle of another kernel.
void Mori624002cAllocator::Free(HostBufferHandle& handle) {
  if (!handle.valid() || !support_.ready()) return;  // mori 452
  try {
    CloseOrphans();
    void* const ptr_to_unmap = handle.ptr;            // mori 454
    const size_t size_to_unmap = handle.mapped_size;  // mori 455
    const HostBufferBacking backing = handle.actual_backing;
    if (!support_.MappedHere(handle)) {
      support_.Warn(texts::kFreeNotOwned, {{"addr", Hex(handle.ptr)}});
      return;
    }
    ShmTaken shm;
    {
      ProcessTables& t = support_.tables();
      std::lock_guard<std::mutex> lock(t.mu);
      t.live.erase(ptr_to_unmap);                                            // the harness's table
      if (IsShm(backing)) shm = support_.TakeShmRecordLocked(ptr_to_unmap);  // mori 458-475
    }
    const HostBufferHandle before = handle;
    AllocatorSupport::Invalidate(handle);  // mori 477-479
    if (shm.defer) {                       // mori 464-469, 481
      support_.Warn(texts::kMoriFreeDeferred,
                    {{"addr", Hex(ptr_to_unmap)}, {"k", std::to_string(shm.holders)}});
      return;
    }
    SysResult r;
    try {
      r = support_.kernel().munmap(ptr_to_unmap, size_to_unmap);  // mori 483
    } catch (const std::exception& e) {
      // A kernel layer that throws (the harness's, not mori's): nothing was released.
      handle = before;
      support_.Restore(before, size_to_unmap, backing, shm.fd_to_close);
      support_.Warn(texts::kFreeMunmapThrew, {{"addr", Hex(ptr_to_unmap)}, {"what", e.what()}});
      return;
    }
    if (r.killed()) return;
    if (!r.ok()) support_.Warn(texts::kMoriMunmapFailed, {{"err", MoriErr(r.error)}});  // 483-491
    if (shm.fd_to_close >= 0) support_.CloseOwned(shm.fd_to_close);                     // mori 493
  } catch (...) {
  }
}

// mori 496-545 (LookupShmAllocation, AcquireShmAllocation) are the same in both allocators:
// host_mem_allocator.cpp.

// mori 547-571: a release that matches nothing is ignored silently.
void Mori624002cAllocator::ReleaseShmAllocation(uintptr_t base) {
  if (!support_.ready()) return;
  try {
    const Released r = DropRegistration(base);  // mori 551-562
    if (!r.ptr) return;
    SysResult u = support_.kernel().munmap(r.ptr, r.len);  // mori 564-568
    if (u.killed()) return;
    if (!u.ok()) support_.Warn(texts::kMoriDeferredMunmapFailed, {{"err", MoriErr(u.error)}});
    if (r.fd >= 0) support_.CloseOwned(r.fd);  // mori 569
  } catch (...) {
  }
}

}  // namespace umbp
