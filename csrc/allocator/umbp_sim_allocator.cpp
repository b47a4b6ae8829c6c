// umbp-sim's allocator (umbp_sim_allocator.h): one Alloc's steps (map, anonymous or memfd,
// hugetlb with its fallback; bind to a node; prefault; record), then Free and the registry's
// release.
#include "allocator/umbp_sim_allocator.h"

#include <fcntl.h>
#include <linux/memfd.h>
#include <linux/mempolicy.h>
#include <sys/mman.h>

#include <cerrno>
#include <climits>
#include <exception>
#include <functional>
#include <mutex>

#include "allocator/allocator_format.h"
#include "allocator/host_files.h"
#include "allocator/warning_texts.h"

namespace umbp {

namespace {

using texts::Fill;

constexpr int kMadvPopulateWrite = 23;  // MADV_POPULATE_WRITE (Linux 5.14); old headers lack it
constexpr size_t kMaxMaskBits = 32768;  // the kernel rejects maxnode - 1 > PAGE_SIZE * 8
constexpr size_t kBitsPerLong = sizeof(unsigned long) * CHAR_BIT;

// The resources a failed or interrupted Alloc step holds: released when an exception unwinds
// through the step (a kernel layer that throws). The normal failure paths release on their own
// and clear the handle.
class HeldOnUnwind {
 public:
  HeldOnUnwind(Kernel& k, HostBufferHandle& h)
      : k_(k), h_(h), uncaught_(std::uncaught_exceptions()) {}
  ~HeldOnUnwind() {
    if (std::uncaught_exceptions() <= uncaught_) return;
    try {
      if (h_.ptr) k_.munmap(h_.ptr, h_.mapped_size);
    } catch (...) {
    }
    try {
      if (h_.fd >= 0) k_.close(h_.fd);
    } catch (...) {
    }
    h_ = HostBufferHandle{};
  }
  HeldOnUnwind(const HeldOnUnwind&) = delete;
  HeldOnUnwind& operator=(const HeldOnUnwind&) = delete;

 private:
  Kernel& k_;
  HostBufferHandle& h_;
  int uncaught_;
};

// One Alloc call: the steps share the kernel, the base page and the warnings. Status::Crash: the
// process died in a kernel call (SysResult::killed()); no further call is made.
class AllocCall {
 public:
  enum class Status { Ok, Demote, Fail, Crash };

  explicit AllocCall(AllocatorSupport& s) : s_(s), k_(s.kernel()), page_(k_.page_size()) {}

  HostBufferHandle Go(size_t size, HostBufferBacking backing, size_t hp, int node, bool prefault) {
    int b = static_cast<int>(backing);
    if (b < 0 || b > 3) {
      s_.Warn(texts::kUnknownBacking, {{"v", std::to_string(b)}});
      return {};
    }
    if (size == 0) {
      s_.Warn(texts::kSizeZero);
      return {};
    }
    if (IsHugetlb(backing) && (!IsPowerOfTwo(hp) || hp <= page_)) {
      // Not a size MAP_HUGE_* can encode: base pages at once, warned once per (backing, size).
      const HostBufferBacking to = Demoted(backing);
      const texts::Warning& w = IsPowerOfTwo(hp) ? texts::kHugepageSizeNotAboveBasePage
                                                 : texts::kHugepageSizeNotPowerOfTwo;
      s_.WarnOnce("hugepage-size:" + BackingName(to) + ":" + std::to_string(hp), w, [&] {
        return Fill(
            w, {{"hp", std::to_string(hp)}, {"page", BasePages(page_)}, {"to", BackingName(to)}});
      });
      backing = to;
    }
    HostBufferHandle h;
    Status s = Attempt(size, backing, hp, node, prefault, h);
    if (s == Status::Demote) s = Attempt(size, Demoted(backing), hp, node, prefault, h);
    if (s != Status::Ok) return {};
    return Record(h);
  }

 private:
  std::string PagesOf(const HostBufferHandle& h) {
    return IsHugetlb(h.actual_backing) ? HugeKb(h.actual_alignment) : BasePages(page_);
  }

  Status Attempt(size_t size, HostBufferBacking backing, size_t hp, int node, bool prefault,
                 HostBufferHandle& h) {
    const bool huge = IsHugetlb(backing);
    const size_t align = huge ? hp : page_;
    auto mapped = AlignUp(size, align);
    if (!mapped) {
      s_.Warn(texts::kRoundingOverflows,
              {{"n", std::to_string(size)}, {"pages", huge ? HugeKb(hp) : BasePages(page_)}});
      return Status::Fail;
    }
    h = HostBufferHandle{};
    h.requested_size = size;
    h.mapped_size = *mapped;
    h.actual_backing = backing;
    h.actual_alignment = align;
    HeldOnUnwind held(k_, h);
    Status s = Map(h, hp);
    if (s != Status::Ok) return s;
    if (node >= 0) {
      s = Bind(h, node);
      if (s != Status::Ok) return s;
    }
    if (prefault) return Prefault(h, node);
    return Status::Ok;
  }

  Status Map(HostBufferHandle& h, size_t hp) {
    const size_t n = h.mapped_size;
    const auto ns = [n] { return std::to_string(n); };  // for a warning only
    const bool huge = IsHugetlb(h.actual_backing);
    const int huge_bits = huge ? HugeSizeBits(hp) : 0;
    if (!IsShm(h.actual_backing)) {
      int flags = MAP_PRIVATE | MAP_ANONYMOUS;
      if (huge) flags |= MAP_HUGETLB | huge_bits;
      SysResult r = k_.mmap(nullptr, n, PROT_READ | PROT_WRITE, flags, -1, 0);
      if (r.killed()) return Status::Crash;
      if (!r.ok()) {
        if (huge) return HugeFail("mmap", texts::kHugetlbMmapFailed, h, hp, r.error);
        s_.Warn(
            texts::kMmapFailed,
            {{"n", ns()}, {"b", "Anonymous"}, {"page", BasePages(page_)}, {"e", ErrName(r.error)}});
        return Status::Fail;
      }
      h.ptr = r.ptr();
      return Status::Ok;
    }
    unsigned mfd = MFD_CLOEXEC;
    if (huge) mfd |= MFD_HUGETLB | static_cast<unsigned>(huge_bits);
    SysResult fd = k_.memfd_create(huge ? "umbp_host_buffer_hugetlb" : "umbp_host_buffer", mfd);
    if (fd.killed()) return Status::Crash;
    if (!fd.ok()) {
      if (huge) return HugeFail("memfd_create", texts::kHugetlbMemfdFailed, h, hp, fd.error);
      s_.Warn(texts::kMemfdFailed, {{"e", ErrName(fd.error)}});
      return Status::Fail;
    }
    h.fd = static_cast<int>(fd.value);
    SysResult t = k_.ftruncate(h.fd, static_cast<off_t>(n));
    if (t.killed()) return Status::Crash;
    if (!t.ok()) {
      if (CloseQuiet(h) == Status::Crash) return Status::Crash;
      if (huge) return HugeFail("ftruncate", texts::kHugetlbFtruncateFailed, h, hp, t.error);
      s_.Warn(texts::kFtruncateFailed, {{"n", ns()}, {"e", ErrName(t.error)}});
      return Status::Fail;
    }
    // MAP_SHARED only: the kernel takes the page size from the file.
    SysResult m = k_.mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, h.fd, 0);
    if (m.killed()) return Status::Crash;
    if (!m.ok()) {
      if (CloseQuiet(h) == Status::Crash) return Status::Crash;
      if (huge) return HugeFail("mmap", texts::kHugetlbMmapFailed, h, hp, m.error);
      s_.Warn(texts::kMmapFailed, {{"n", ns()},
                                   {"b", "AnonymousShm"},
                                   {"page", BasePages(page_)},
                                   {"e", ErrName(m.error)}});
      return Status::Fail;
    }
    h.ptr = m.ptr();
    return Status::Ok;
  }

  // A hugetlb step failed: demote, with a warning once per (backing, step, size, errno) that
  // carries the requested size's counters.
  Status HugeFail(const char* step, const texts::Warning& w, const HostBufferHandle& h, size_t hp,
                  int err) {
    const HostBufferBacking backing = h.actual_backing;
    s_.WarnOnce("hugetlb:" + BackingName(backing) + ":" + step + ":" + std::to_string(hp) + ":" +
                    ErrName(err),
                w, [&] {
                  return Fill(w, {{"n", std::to_string(h.mapped_size)},
                                  {"hp_kb", HugeKb(hp)},
                                  {"e", ErrName(err)},
                                  {"counters", HugepageCounters(k_, hp)},
                                  {"page", BasePages(page_)},
                                  {"to", BackingName(Demoted(backing))}});
                });
    return Status::Demote;
  }

  // Close the memfd of a failed step.
  Status CloseQuiet(HostBufferHandle& h) {
    const int fd = h.fd;
    h.fd = -1;
    SysResult c = k_.close(fd);
    if (c.killed()) return Status::Crash;
    if (!c.ok()) {
      s_.Warn(texts::kStepCloseFailed, {{"fd", std::to_string(fd)}, {"e", ErrName(c.error)}});
    }
    return Status::Ok;
  }

  // Undo a mapping made by this call (prefault failed).
  Status Unmap(HostBufferHandle& h) {
    SysResult r = k_.munmap(h.ptr, h.mapped_size);
    if (r.killed()) return Status::Crash;
    if (!r.ok()) {
      s_.Warn(
          texts::kCleanupMunmapFailed,
          {{"addr", Hex(h.ptr)}, {"n", std::to_string(h.mapped_size)}, {"e", ErrName(r.error)}});
    }
    void* const ptr = h.ptr;
    h.ptr = nullptr;
    if (h.fd >= 0) {
      const int fd = h.fd;
      h.fd = -1;
      SysResult c = k_.close(fd);
      if (c.killed()) return Status::Crash;
      if (!c.ok()) {
        s_.Warn(texts::kCloseFailed,
                {{"fd", std::to_string(fd)}, {"addr", Hex(ptr)}, {"e", ErrName(c.error)}});
      }
    }
    h = HostBufferHandle{};
    return Status::Ok;
  }

  Status NotPossible(int node, const std::string& list) {
    s_.WarnOnce("numa:outside:" + std::to_string(node), texts::kNodeNotPossible, [&] {
      return Fill(texts::kNodeNotPossible, {{"node", std::to_string(node)}, {"list", list}});
    });
    return Status::Ok;
  }

  // Bind to a node /sys/devices/system/node/possible lists, with a mask whose maxnode covers the
  // node's bit (the kernel reads maxnode - 1 bits); a failure leaves the buffer unbound.
  Status Bind(HostBufferHandle& h, int node) {
    FileResult possible = k_.read_file("/sys/devices/system/node/possible");
    if (!possible.ok()) {
      s_.WarnOnce("numa:possible", texts::kPossibleUnreadable, [&] {
        return Fill(texts::kPossibleUnreadable,
                    {{"node", std::to_string(node)}, {"e", ErrName(possible.error)}});
      });
      return Status::Ok;
    }
    std::string list = possible.data;
    while (!list.empty() && (list.back() == '\n' || list.back() == ' ')) list.pop_back();
    auto in = NodeListContains(list, node);
    if (!in) {
      s_.WarnOnce("numa:possible", texts::kPossibleUnparsable, [&] {
        return Fill(texts::kPossibleUnparsable, {{"node", std::to_string(node)}, {"list", list}});
      });
      return Status::Ok;
    }
    const size_t bit = static_cast<size_t>(node);
    if (!*in || bit + 1 >= kMaxMaskBits) return NotPossible(node, list);
    const size_t words = bit / kBitsPerLong + 1;
    AllocatorSupport::MaskMemory mask(k_, words);
    mask.data()[bit / kBitsPerLong] = 1UL << (bit % kBitsPerLong);
    const unsigned long maxnode = static_cast<unsigned long>(node) + 2;
    SysResult r = k_.mbind(h.ptr, h.mapped_size, MPOL_BIND, mask.data(), maxnode, 0);
    if (r.killed()) return Status::Crash;
    if (!r.ok()) {
      s_.WarnOnce("mbind:" + std::to_string(node) + ":" + ErrName(r.error), texts::kMbindFailed,
                  [&] {
                    return Fill(texts::kMbindFailed, {{"node", std::to_string(node)},
                                                      {"n", std::to_string(h.mapped_size)},
                                                      {"e", ErrName(r.error)}});
                  });
      return Status::Ok;
    }
    h.numa_node = node;
    return Status::Ok;
  }

  // Touch one byte per page (the manual prefault). A failure of the simulated touch itself (not
  // a signal) leaves the buffer unpopulated.
  Status TouchByHand(HostBufferHandle& h) {
    SysResult t = k_.touch(h.ptr, h.mapped_size, h.actual_alignment);
    if (t.killed()) return Status::Crash;
    if (!t.ok()) {
      s_.Warn(texts::kTouchFailed, {{"n", std::to_string(h.mapped_size)}, {"e", ErrName(t.error)}});
    }
    return Status::Ok;
  }

  Status Prefault(HostBufferHandle& h, int node) {
    SysResult r = k_.madvise(h.ptr, h.mapped_size, kMadvPopulateWrite);
    if (r.killed()) return Status::Crash;
    if (r.ok()) return Status::Ok;
    const std::string ns = std::to_string(h.mapped_size);
    if (r.error == EINVAL) {  // before Linux 5.14
      s_.WarnOnce("populate-write-einval", texts::kPopulateEinval,
                  [] { return std::string(texts::kPopulateEinval.text); });
      return TouchByHand(h);
    }
    if (r.error == EFAULT && IsHugetlb(h.actual_backing)) {
      // Touching now would be a SIGBUS: no hugepage for this mapping on the allowed nodes.
      const size_t hp = h.actual_alignment;
      const HostBufferBacking backing = h.actual_backing;
      std::string counters;
      try {
        counters = HugepageCounters(k_, hp);
      } catch (...) {
      }
      if (Unmap(h) == Status::Crash) return Status::Crash;
      s_.WarnOnce("hugetlb:" + BackingName(backing) + ":populate:" + std::to_string(hp) +
                      ":EFAULT:" + std::to_string(node),
                  texts::kHugetlbPopulateEfault, [&] {
                    return Fill(texts::kHugetlbPopulateEfault,
                                {{"n", ns},
                                 {"hp_kb", HugeKb(hp)},
                                 {"counters", counters},
                                 {"page", BasePages(page_)},
                                 {"to", BackingName(Demoted(backing))}});
                  });
      return Status::Demote;
    }
    const std::string b = BackingName(h.actual_backing), pages = PagesOf(h);  // before Unmap
    if (Unmap(h) == Status::Crash) return Status::Crash;
    s_.Warn(texts::kPopulateFailed,
            {{"n", ns}, {"b", b}, {"pages", pages}, {"e", ErrName(r.error)}});
    return Status::Fail;
  }

  // Only a buffer it returns is recorded (live table, and the registry for shm).
  HostBufferHandle Record(HostBufferHandle h) {
    try {
      return s_.Record(h);
    } catch (const std::exception& e) {
      Unmap(h);
      s_.Warn(texts::kInternalError, {{"what", e.what()}});
      return {};
    }
  }

  AllocatorSupport& s_;
  Kernel& k_;
  size_t page_;
};

}  // namespace

UmbpSimAllocator::UmbpSimAllocator(KernelPtr kernel, LogSink sink)
    : HostMemAllocator(std::move(kernel), std::move(sink)) {}

HostBufferHandle UmbpSimAllocator::Alloc(size_t size, HostBufferBacking backing,
                                         size_t hugepage_size, int numa_node, bool prefault) {
  if (!support_.ready()) {
    support_.Warn(texts::kNoKernel);
    return {};
  }
  try {
    CloseOrphans();
  } catch (...) {
  }
  try {
    AllocCall call(support_);
    return call.Go(size, backing, hugepage_size, numa_node, prefault);
  } catch (const std::exception& e) {
    // What the failed step held was released while unwinding (HeldOnUnwind).
    support_.Warn(texts::kInternalError, {{"what", e.what()}});
  } catch (...) {
    support_.Warn(texts::kInternalError, {{"what", "unknown exception"}});
  }
  return {};
}

void UmbpSimAllocator::CloseOwned(int fd, void* ptr) {
  std::optional<SysResult> c = support_.CloseOwned(fd);
  if (c && !c->killed() && !c->ok()) {
    support_.Warn(texts::kCloseFailed,
                  {{"fd", std::to_string(fd)}, {"addr", Hex(ptr)}, {"e", ErrName(c->error)}});
  }
}

void UmbpSimAllocator::CloseOrphans() {
  support_.CloseOrphans([&](int fd, const SysResult& c) {
    support_.Warn(texts::kCloseFailed,
                  {{"fd", std::to_string(fd)}, {"addr", Hex(nullptr)}, {"e", ErrName(c.error)}});
  });
}

void UmbpSimAllocator::Unmapped(const SysResult& r, void* ptr, size_t len, int fd,
                                const texts::Warning& failed) {
  if (r.killed()) return;
  if (!r.ok()) {
    support_.Warn(failed,
                  {{"addr", Hex(ptr)}, {"n", std::to_string(len)}, {"e", ErrName(r.error)}});
  }
  if (fd >= 0) CloseOwned(fd, ptr);
}

void UmbpSimAllocator::Free(HostBufferHandle& handle) {
  if (!handle.valid() || !support_.ready()) return;
  try {
    CloseOrphans();
    void* ptr = handle.ptr;
    size_t len = handle.mapped_size;
    HostBufferBacking backing = handle.actual_backing;
    bool owned = support_.MappedHere(handle);
    ShmTaken shm;
    if (owned) {
      // Its own table, not the handle: a stale copy (another serial at the address) is refused.
      ProcessTables& t = support_.tables();
      std::lock_guard<std::mutex> lock(t.mu);
      auto it = t.live.find(ptr);
      if (it == t.live.end() || (handle.serial != 0 && it->second.serial != handle.serial)) {
        owned = false;
      } else {
        len = it->second.mapped_size;
        backing = it->second.backing;
        shm.fd_to_close = it->second.fd;
        t.live.erase(it);
        if (IsShm(backing)) shm = support_.TakeShmRecordLocked(ptr);
      }
    }
    if (!owned) {
      support_.Warn(texts::kFreeNotOwned, {{"addr", Hex(handle.ptr)}});
      return;
    }
    const HostBufferHandle before = handle;
    AllocatorSupport::Invalidate(handle);
    if (shm.defer) {
      support_.Warn(texts::kFreeDeferred, {{"b", BackingName(backing)},
                                           {"addr", Hex(ptr)},
                                           {"n", std::to_string(len)},
                                           {"k", std::to_string(shm.holders)}});
      return;
    }
    SysResult r;
    try {
      r = support_.kernel().munmap(ptr, len);
    } catch (const std::exception& e) {
      // Nothing was released: the buffer stays owned and the handle valid, so Free can retry.
      handle = before;
      support_.Restore(before, len, backing, shm.fd_to_close);
      support_.Warn(texts::kFreeMunmapThrew, {{"addr", Hex(ptr)}, {"what", e.what()}});
      return;
    }
    Unmapped(r, ptr, len, shm.fd_to_close, texts::kFreeMunmapFailed);
  } catch (...) {
    // Only a warning's string building can throw here; the handle state is already settled.
  }
}

void UmbpSimAllocator::ReleaseShmAllocation(uintptr_t base) {
  if (!support_.ready()) return;
  try {
    const Released r = DropRegistration(base);
    const std::string where = Hex(reinterpret_cast<void*>(base));
    if (r.status == Released::kUnknown) {
      support_.Warn(texts::kReleaseUnknown, {{"addr", where}});
      return;
    }
    if (r.status == Released::kUnmatched) {
      support_.Warn(texts::kReleaseUnmatched, {{"addr", where}});
      return;
    }
    if (!r.ptr) return;
    Unmapped(support_.kernel().munmap(r.ptr, r.len), r.ptr, r.len, r.fd,
             texts::kDeferredMunmapFailed);
  } catch (...) {
  }
}

}  // namespace umbp
