// The steps of one Alloc call: map (anonymous or memfd, hugetlb with its fallback), bind to a
// node, prefault, register. host_mem_allocator.cpp holds the API around them.
#include "allocator/alloc_run.h"

#include <fcntl.h>
#include <linux/memfd.h>
#include <linux/mempolicy.h>
#include <sys/mman.h>

#include <cerrno>
#include <climits>
#include <exception>
#include <functional>
#include <new>

#include "allocator/allocator_state.h"
#include "allocator/host_files.h"
#include "allocator/warning_texts.h"

namespace umbp {

namespace {

using texts::Fill;

constexpr int kMadvPopulateWrite = 23;  // MADV_POPULATE_WRITE (Linux 5.14); old headers lack it
constexpr int kHugeShift = 26;          // MAP_HUGE_SHIFT == MFD_HUGE_SHIFT
constexpr size_t kMaxMaskBits = 32768;  // the kernel rejects maxnode - 1 > PAGE_SIZE * 8
constexpr size_t kBitsPerLong = sizeof(unsigned long) * CHAR_BIT;

// The resources a failed or interrupted Alloc step holds: released when an exception unwinds
// through the step (a kernel layer that throws), unless the policy lets exceptions escape with
// what was mapped (mori). The normal failure paths release on their own and clear the handle.
class HeldOnUnwind {
 public:
  HeldOnUnwind(Kernel& k, HostBufferHandle& h, bool armed)
      : k_(k), h_(h), armed_(armed), uncaught_(std::uncaught_exceptions()) {}
  ~HeldOnUnwind() {
    if (!armed_ || std::uncaught_exceptions() <= uncaught_) return;
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
  bool armed_;
  int uncaught_;
};

}  // namespace

// One Alloc call: the steps share the kernel, the policy and the warnings. Status::Crash: the
// process died in a kernel call (SysResult::killed()); no further call is made.
class AllocRun {
 public:
  enum class Status { Ok, Demote, Fail, Crash };

  explicit AllocRun(HostMemAllocator& a)
      : a_(a), k_(*a.kernel_), p_(a.policy_), page_(k_.page_size()) {}

  HostBufferHandle Go(size_t size, HostBufferBacking backing, size_t hp, int node, bool prefault) {
    int b = static_cast<int>(backing);
    if (b < 0 || b > 3) {
      Say(Fill(texts::kUnknownBacking, {{"v", std::to_string(b)}}));
      return {};
    }
    if (size == 0) {
      Say(texts::kSizeZero);
      return {};
    }
    if (IsHugetlb(backing)) {
      const HostBufferBacking to = Demoted(backing);
      if (!IsPowerOfTwo(hp)) {
        if (p_.mori_texts) {
          Warn(Fill(to == HostBufferBacking::AnonymousShm ? texts::kMoriInvalidHugepageSizeShm
                                                          : texts::kMoriInvalidHugepageSize,
                    {{"hp", std::to_string(hp)}}));
        } else {
          a_.WarnOnce("hugepage-size:" + BackingName(to) + ":" + std::to_string(hp), [&] {
            return Fill(
                texts::kHugepageSizeNotPowerOfTwo,
                {{"hp", std::to_string(hp)}, {"page", BasePages(page_)}, {"to", BackingName(to)}});
          });
        }
        backing = to;
      } else if (hp <= page_ && p_.hugepage_size_above_base_page) {
        a_.WarnOnce("hugepage-size:" + BackingName(to) + ":" + std::to_string(hp), [&] {
          return Fill(
              texts::kHugepageSizeNotAboveBasePage,
              {{"hp", std::to_string(hp)}, {"page", BasePages(page_)}, {"to", BackingName(to)}});
        });
        backing = to;
      }
    }
    HostBufferHandle h;
    Status s = Attempt(size, backing, hp, node, prefault, h);
    if (s == Status::Demote) s = Attempt(size, Demoted(backing), hp, node, prefault, h);
    if (s != Status::Ok) return {};
    return p_.register_shm_before_policies && IsShm(h.actual_backing) ? h : Register(h);
  }

 private:
  void Warn(const std::string& text) { a_.Warn(text); }
  // A warning umbp-sim prints and mori does not.
  void Say(const std::string& text) {
    if (!p_.mori_texts) Warn(text);
  }

  std::string PagesOf(const HostBufferHandle& h) {
    return IsHugetlb(h.actual_backing) ? HugeKb(h.actual_alignment) : BasePages(page_);
  }

  Status Attempt(size_t size, HostBufferBacking backing, size_t hp, int node, bool prefault,
                 HostBufferHandle& h) {
    const bool huge = IsHugetlb(backing);
    const size_t align = huge ? hp : page_;
    auto mapped = AlignUp(size, align);
    if (!mapped) {
      Say(Fill(texts::kRoundingOverflows,
               {{"n", std::to_string(size)}, {"pages", huge ? HugeKb(hp) : BasePages(page_)}}));
      return Status::Fail;
    }
    h = HostBufferHandle{};
    h.requested_size = size;
    h.mapped_size = *mapped;
    h.actual_backing = backing;
    h.actual_alignment = align;
    HeldOnUnwind held(k_, h, !p_.exceptions_escape);
    Status s = Map(h, hp);
    if (s != Status::Ok) return s;
    if (p_.register_shm_before_policies && IsShm(h.actual_backing)) {
      h = Register(h);
      if (!h.valid()) return Status::Fail;
    }
    if (node >= 0) {
      s = Bind(h, node);
      if (s != Status::Ok) return s;
    }
    if (prefault) return Prefault(h, node);
    return Status::Ok;
  }

  Status Map(HostBufferHandle& h, size_t hp) {
    const size_t n = h.mapped_size;
    const std::string ns = std::to_string(n);
    // log2(size) in bits 26..31; sizes >= 2^32 (16 GiB pages) set the sign bit of the int flags,
    // as the kernel's own MAP_HUGE_16GB does, so shift as unsigned.
    const int huge_bits = IsHugetlb(h.actual_backing)
                              ? static_cast<int>(static_cast<unsigned>(Log2(hp)) << kHugeShift)
                              : 0;
    switch (h.actual_backing) {
      case HostBufferBacking::Anonymous:
      case HostBufferBacking::AnonymousHugetlb: {
        const bool huge = h.actual_backing == HostBufferBacking::AnonymousHugetlb;
        int flags = MAP_PRIVATE | MAP_ANONYMOUS;
        if (huge) flags |= MAP_HUGETLB | huge_bits;
        SysResult r = k_.mmap(nullptr, n, PROT_READ | PROT_WRITE, flags, -1, 0);
        if (r.killed()) return Status::Crash;
        if (!r.ok()) {
          if (huge) {
            return HugeFail("mmap", texts::kHugetlbMmapFailed, h, hp, r.error);
          }
          Say(Fill(texts::kMmapFailed, {{"n", ns},
                                        {"b", "Anonymous"},
                                        {"page", BasePages(page_)},
                                        {"e", ErrName(r.error)}}));
          return Status::Fail;
        }
        h.ptr = r.ptr();
        return Status::Ok;
      }
      case HostBufferBacking::AnonymousShm:
      case HostBufferBacking::AnonymousShmHugetlb: {
        const bool huge = h.actual_backing == HostBufferBacking::AnonymousShmHugetlb;
        unsigned mfd = MFD_CLOEXEC;
        if (huge) mfd |= MFD_HUGETLB | static_cast<unsigned>(huge_bits);
        SysResult fd = k_.memfd_create(huge ? "umbp_host_buffer_hugetlb" : "umbp_host_buffer", mfd);
        if (fd.killed()) return Status::Crash;
        if (!fd.ok()) {
          if (huge) {
            return HugeFail("memfd_create", texts::kHugetlbMemfdFailed, h, hp, fd.error);
          }
          if (p_.mori_texts) {
            Warn(Fill(texts::kMoriMemfdFailed, {{"err", MoriErr(fd.error)}}));
          } else {
            Warn(Fill(texts::kMemfdFailed, {{"e", ErrName(fd.error)}}));
          }
          return Status::Fail;
        }
        h.fd = static_cast<int>(fd.value);
        SysResult t = k_.ftruncate(h.fd, static_cast<off_t>(n));
        if (t.killed()) return Status::Crash;
        if (!t.ok()) {
          if (CloseQuiet(h) == Status::Crash) return Status::Crash;
          if (p_.mori_texts) {
            // mori 264-270, 345-353: said every time, also before the hugetlb fallback.
            Warn(Fill(texts::kMoriFtruncateFailed, {{"what", huge ? "hugetlb memfd" : "memfd"},
                                                    {"n", ns},
                                                    {"err", MoriErr(t.error)}}));
            return huge ? Status::Demote : Status::Fail;
          }
          if (huge) {
            return HugeFail("ftruncate", texts::kHugetlbFtruncateFailed, h, hp, t.error);
          }
          Warn(Fill(texts::kFtruncateFailed, {{"n", ns}, {"e", ErrName(t.error)}}));
          return Status::Fail;
        }
        int mflags = MAP_SHARED;
        if (huge && p_.map_hugetlb_on_memfd) mflags |= MAP_HUGETLB;
        SysResult m = k_.mmap(nullptr, n, PROT_READ | PROT_WRITE, mflags, h.fd, 0);
        if (m.killed()) return Status::Crash;
        if (!m.ok()) {
          if (CloseQuiet(h) == Status::Crash) return Status::Crash;
          if (huge) {
            return HugeFail("mmap", texts::kHugetlbMmapFailed, h, hp, m.error);
          }
          if (p_.mori_texts) {
            Warn(Fill(texts::kMoriMmapFailed, {{"n", ns}, {"err", MoriErr(m.error)}}));
          } else {
            Warn(Fill(texts::kMmapFailed, {{"n", ns},
                                           {"b", "AnonymousShm"},
                                           {"page", BasePages(page_)},
                                           {"e", ErrName(m.error)}}));
          }
          return Status::Fail;
        }
        h.ptr = m.ptr();
        return Status::Ok;
      }
    }
    return Status::Fail;
  }

  // A hugetlb step failed: demote, with a once-only warning (per (backing, step, size, errno)
  // with the requested size's counters; mori: one for the whole process, the default pool's).
  Status HugeFail(const char* step, const char* text, const HostBufferHandle& h, size_t hp,
                  int err) {
    const HostBufferBacking backing = h.actual_backing;
    if (p_.one_hugetlb_warning_per_process) {
      a_.WarnOnce("mori:hugetlb-fallback", [&] {
        return Fill(texts::kMoriHugetlbFallback, {{"n", std::to_string(h.requested_size)},
                                                  {"hp", std::to_string(hp)},
                                                  {"err", MoriErr(err)},
                                                  {"meminfo", MoriMeminfoSummary(k_)}});
      });
      return Status::Demote;
    }
    a_.WarnOnce("hugetlb:" + BackingName(backing) + ":" + step + ":" + std::to_string(hp) + ":" +
                    ErrName(err),
                [&] {
                  return Fill(text, {{"n", std::to_string(h.mapped_size)},
                                     {"hp_kb", HugeKb(hp)},
                                     {"e", ErrName(err)},
                                     {"counters", HugepageCounters(k_, hp)},
                                     {"page", BasePages(page_)},
                                     {"to", BackingName(Demoted(backing))}});
                });
    return Status::Demote;
  }

  // Close the memfd of a failed step (mori: silently).
  Status CloseQuiet(HostBufferHandle& h) {
    const int fd = h.fd;
    h.fd = -1;
    SysResult c = k_.close(fd);
    if (c.killed()) return Status::Crash;
    if (!c.ok()) {
      Say(Fill(texts::kStepCloseFailed, {{"fd", std::to_string(fd)}, {"e", ErrName(c.error)}}));
    }
    return Status::Ok;
  }

  // Undo a mapping made by this run (prefault failed).
  Status Unmap(HostBufferHandle& h) {
    SysResult r = k_.munmap(h.ptr, h.mapped_size);
    if (r.killed()) return Status::Crash;
    if (!r.ok()) {
      Warn(Fill(
          texts::kCleanupMunmapFailed,
          {{"addr", Hex(h.ptr)}, {"n", std::to_string(h.mapped_size)}, {"e", ErrName(r.error)}}));
    }
    void* const ptr = h.ptr;
    h.ptr = nullptr;
    if (h.fd >= 0) {
      const int fd = h.fd;
      h.fd = -1;
      SysResult c = k_.close(fd);
      if (c.killed()) return Status::Crash;
      if (!c.ok()) {
        Warn(Fill(texts::kCloseFailed,
                  {{"fd", std::to_string(fd)}, {"addr", Hex(ptr)}, {"e", ErrName(c.error)}}));
      }
    }
    h = HostBufferHandle{};
    return Status::Ok;
  }

  // The nodemask mori builds: numa_node/64+1 words. Large blocks come from mmap as malloc
  // would take them (glibc's 128 KiB threshold), so a simulated RLIMIT_AS or memory limit
  // refuses them as the real one does: std::bad_alloc.
  class MaskMemory {
   public:
    MaskMemory(Kernel& k, size_t words) : k_(k), bytes_(words * sizeof(unsigned long)) {
      if (bytes_ < (size_t{128} << 10)) {
        small_.assign(words, 0UL);
        data_ = small_.data();
        return;
      }
      SysResult r =
          k_.mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (!r.ok()) throw std::bad_alloc();
      data_ = static_cast<unsigned long*>(r.ptr());
      mapped_ = true;
    }
    ~MaskMemory() {
      if (mapped_) k_.munmap(data_, bytes_);
    }
    MaskMemory(const MaskMemory&) = delete;
    MaskMemory& operator=(const MaskMemory&) = delete;
    unsigned long* data() { return data_; }

   private:
    Kernel& k_;
    size_t bytes_;
    std::vector<unsigned long> small_;
    unsigned long* data_ = nullptr;
    bool mapped_ = false;
  };

  Status NotPossible(int node, const std::string& list) {
    a_.WarnOnce("numa:outside:" + std::to_string(node), [&] {
      return Fill(texts::kNodeNotPossible, {{"node", std::to_string(node)}, {"list", list}});
    });
    return Status::Ok;
  }

  Status Bind(HostBufferHandle& h, int node) {
    std::string list;
    if (p_.check_possible_nodes) {
      FileResult possible = k_.read_file("/sys/devices/system/node/possible");
      if (!possible.ok()) {
        a_.WarnOnce("numa:possible", [&] {
          return Fill(texts::kPossibleUnreadable,
                      {{"node", std::to_string(node)}, {"e", ErrName(possible.error)}});
        });
        return Status::Ok;
      }
      list = possible.data;
      while (!list.empty() && (list.back() == '\n' || list.back() == ' ')) list.pop_back();
      auto in = NodeListContains(list, node);
      if (!in) {
        a_.WarnOnce("numa:possible", [&] {
          return Fill(texts::kPossibleUnparsable, {{"node", std::to_string(node)}, {"list", list}});
        });
        return Status::Ok;
      }
      if (!*in) {
        return NotPossible(node, list);
      }
    }
    const size_t bit = static_cast<size_t>(node);
    if (p_.cap_nodemask && bit + 1 >= kMaxMaskBits) {
      return NotPossible(node, list);
    }
    const size_t words = bit / kBitsPerLong + 1;
    MaskMemory mask(k_, words);
    mask.data()[bit / kBitsPerLong] = 1UL << (bit % kBitsPerLong);
    // NodePlusTwo: the kernel reads maxnode-1 bits, so bit `node` is among them.
    const unsigned long maxnode = p_.maxnode == AllocatorPolicy::Maxnode::WordBits
                                      ? static_cast<unsigned long>(words * kBitsPerLong)
                                      : static_cast<unsigned long>(node) + 2;
    SysResult r = k_.mbind(h.ptr, h.mapped_size, MPOL_BIND, mask.data(), maxnode, 0);
    if (r.killed()) return Status::Crash;
    if (!r.ok()) {
      if (p_.mori_texts) {
        if (r.error == ENOSYS) {
          a_.WarnOnce("mori:numa-unavailable",
                      [] { return std::string(texts::kMoriNumaUnavailable); });
        } else {
          Warn(Fill(texts::kMoriMbindFailed,
                    {{"node", std::to_string(node)}, {"err", MoriErr(r.error)}}));
        }
        return Status::Ok;
      }
      a_.WarnOnce("mbind:" + std::to_string(node) + ":" + ErrName(r.error), [&] {
        return Fill(texts::kMbindFailed, {{"node", std::to_string(node)},
                                          {"n", std::to_string(h.mapped_size)},
                                          {"e", ErrName(r.error)}});
      });
      return Status::Ok;
    }
    h.numa_node = node;
    return Status::Ok;
  }

  // Touch one byte per page (the manual prefault). Nothing checks the result: a failure
  // of the simulated touch itself (not a signal) leaves the buffer unpopulated.
  Status TouchByHand(HostBufferHandle& h) {
    SysResult t = k_.touch(h.ptr, h.mapped_size, h.actual_alignment);
    if (t.killed()) return Status::Crash;
    if (!t.ok()) {
      Say(Fill(texts::kTouchFailed,
               {{"n", std::to_string(h.mapped_size)}, {"e", ErrName(t.error)}}));
    }
    return Status::Ok;
  }

  Status Prefault(HostBufferHandle& h, int node) {
    SysResult r = k_.madvise(h.ptr, h.mapped_size, kMadvPopulateWrite);
    if (r.killed()) return Status::Crash;
    if (r.ok()) return Status::Ok;
    const std::string ns = std::to_string(h.mapped_size);
    if (p_.populate_failure == AllocatorPolicy::PopulateFailure::TouchByHand) {
      Warn(Fill(texts::kMoriPopulateFailed, {{"err", MoriErr(r.error)}}));
      return TouchByHand(h);
    }
    if (r.error == EINVAL) {
      a_.WarnOnce("populate-write-einval", [&] { return std::string(texts::kPopulateEinval); });
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
      a_.WarnOnce("hugetlb:" + BackingName(backing) + ":populate:" + std::to_string(hp) +
                      ":EFAULT:" + std::to_string(node),
                  [&] {
                    return Fill(texts::kHugetlbPopulateEfault,
                                {{"n", ns},
                                 {"hp_kb", HugeKb(hp)},
                                 {"counters", counters},
                                 {"page", BasePages(page_)},
                                 {"to", BackingName(Demoted(backing))}});
                  });
      return Status::Demote;
    }
    const std::string what = Fill(texts::kPopulateFailed, {{"n", ns},
                                                           {"b", BackingName(h.actual_backing)},
                                                           {"pages", PagesOf(h)},
                                                           {"e", ErrName(r.error)}});
    if (Unmap(h) == Status::Crash) return Status::Crash;
    Warn(what);
    return Status::Fail;
  }

  HostBufferHandle Register(HostBufferHandle h) {
    auto& st = *a_.state_;
    try {
      std::lock_guard<std::mutex> lock(st.mu);
      h.serial = NextSerial();
      h.kernel_id = k_.id();
      LiveBuffer b;
      b.ptr = h.ptr;
      b.requested_size = h.requested_size;
      b.mapped_size = h.mapped_size;
      b.backing = h.actual_backing;
      b.alignment = h.actual_alignment;
      b.fd = h.fd;
      b.numa_node = h.numa_node;
      b.serial = h.serial;
      st.live[h.ptr] = b;
      if (IsShm(h.actual_backing)) {
        try {
          ShmRegistryEntry e;
          e.base = h.ptr;
          e.mapped_size = h.mapped_size;
          e.fd = h.fd;
          st.shm[h.ptr] = e;
        } catch (...) {
          st.live.erase(h.ptr);
          throw;
        }
      }
      return h;
    } catch (const std::exception& e) {
      if (p_.exceptions_escape) throw;
      Unmap(h);
      Warn(Fill(texts::kInternalError, {{"what", e.what()}}));
      return {};
    }
  }

  HostMemAllocator& a_;
  Kernel& k_;
  const AllocatorPolicy& p_;
  size_t page_;
};

HostBufferHandle RunAlloc(HostMemAllocator& a, size_t size, HostBufferBacking backing, size_t hp,
                          int node, bool prefault) {
  AllocRun run(a);
  return run.Go(size, backing, hp, node, prefault);
}

}  // namespace umbp
