// clang-format off
// HostMemAllocator on the Kernel seam. See host_mem_allocator.h for the contract.
//
// Warning texts (product: scenarios match them; keep them stable). Placeholders: <N> bytes as a
// decimal, <P> base page ("4 KiB"), <H> hugepage size in kB ("2048"), <E> errno name ("ENOMEM"),
// <ADDR> "0x7f...", <B> backing name, <C> the hugepage counters of the *requested* size:
//   "HugePages of <H> kB: free <F>, total <T>, reserved <R>"     (sysfs, or /proc/meminfo if <H>
//                                                                 is the default size)
//   "HugePages of <H> kB: not configured on this kernel"         (no sysfs dir, not the default)
//   "HugePages of <H> kB: counters unavailable"                   (nothing readable)
// Once per Kernel instance and reason ([once] below; the reason key is in brackets):
//   [hugepage-size:<fallback B>:<hp>]
//     "hugepage_size <hp> is not a power of two; falling back to <P> pages (<B>)"
//     "hugepage_size <hp> cannot be encoded in MAP_HUGE_* (not larger than the <P> base page);
//      falling back to <P> pages (<B>)"
//   [hugetlb:<B>:<step>:<hp>:<E>]   B = requested backing, step = memfd_create | ftruncate | mmap
//     "hugetlb memfd_create (<H> kB pages) failed: <E>; <C>; falling back to <P> pages
//      (AnonymousShm)"
//     "hugetlb ftruncate of the memfd to <N> bytes (<H> kB pages) failed: <E>; <C>; falling back
//      to <P> pages (AnonymousShm)"
//     "hugetlb mmap of <N> bytes (<H> kB pages) failed: <E>; <C>; falling back to <P> pages (<B>)"
//   [hugetlb:<B>:populate:<hp>:EFAULT:<node>]
//     "MADV_POPULATE_WRITE of <N> bytes (<H> kB pages) failed: EFAULT (no free hugepage on the
//      allowed nodes); <C>; unmapped, falling back to <P> pages (<B>)"
//   [numa:possible]
//     "numa_node <n> requested but /sys/devices/system/node/possible cannot be read (<E>); buffer
//      not bound"
//     "numa_node <n> requested but /sys/devices/system/node/possible cannot be parsed ('<text>');
//      buffer not bound"
//   [numa:outside:<n>]
//     "numa_node <n> is not a possible NUMA node (possible: <list>); buffer not bound"
//   [mbind:<n>:<E>]
//     "mbind(MPOL_BIND, node <n>) of <N> bytes failed: <E>; buffer not bound to node <n>"
//   [populate-write-einval]
//     "madvise(MADV_POPULATE_WRITE) is not supported by this kernel (EINVAL; needs Linux 5.14);
//      prefaulting by touching one byte per page"
// Every time:
//   "Alloc(size=0): nothing to allocate; returning an invalid handle"
//   "Alloc(size=<N>): rounding up to <P|H kB> pages overflows; returning an invalid handle"
//   "Alloc: unknown backing <v>; returning an invalid handle"
//   "mmap of <N> bytes (<B>, <P> pages) failed: <E>; returning an invalid handle"
//   "memfd_create(umbp_host_buffer) failed: <E>; returning an invalid handle"
//   "ftruncate of the memfd to <N> bytes failed: <E>; returning an invalid handle"
//   "MADV_POPULATE_WRITE of <N> bytes (<B>, <P|H kB> pages) failed: <E>; unmapped, returning an
//    invalid handle"                                   (ENOMEM, EFAULT off hugetlb, other errnos)
//   "prefault touch of <N> bytes failed: <E>; buffer left unpopulated"
//   "munmap(<ADDR>, <N>) failed: <E>; handle invalidated anyway so a later Free cannot unmap a
//    reused address"
//   "munmap(<ADDR>, <N>) while cleaning up a failed Alloc failed: <E>"
//   "close(<fd>) of the memfd of <ADDR> failed: <E>"
//   "close(<fd>) of a memfd after a failed Alloc step failed: <E>"
//   "Free of <ADDR>, which no allocator on this kernel owns (freed through a copy of its handle,
//    or allocated on another kernel); nothing unmapped, handle unchanged"
//   "Free of <B> buffer <ADDR> (<N> bytes) while <k> registration(s) hold it; munmap and close
//    deferred to the last ReleaseShmAllocation"
//   "deferred munmap(<ADDR>, <N>) at the last ReleaseShmAllocation failed: <E>"
//   "ReleaseShmAllocation(<ADDR>): no shm allocation is based there; ignored"
//   "ReleaseShmAllocation(<ADDR>) without a matching AcquireShmAllocation; ignored"
//   "Alloc: internal error (<what>); returning an invalid handle"
//   "Alloc: no kernel; returning an invalid handle"
// (Wrapped lines above are one line in the text, joined by a single space.)
//
// Under the mori-624002c policy the texts are mori's MORI_UMBP_WARN lines instead (<e> errno
// number, <s> strerror, <S> requested size, <M> mapped size, <MI> "HugePages_Total:  T
// HugePages_Free:  F Hugepagesize:  K kB" as the /proc/meminfo lines read):
//   once per kernel for every hugetlb fallback together:
//     "HostMemAllocator: MAP_HUGETLB allocation failed for size=<S> hugepage_size=<hp> (<e>: <s>);
//      falling back to anonymous pages. <MI>"
//   once: "HostMemAllocator: NUMA binding unavailable on this build; ignoring numa_node" (ENOSYS)
//   every time:
//     "HostMemAllocator: invalid hugepage_size=<hp>; falling back to anonymous pages"
//     "HostMemAllocator: invalid hugepage_size=<hp>; falling back to AnonymousShm (4 KiB pages)"
//     "HostMemAllocator: memfd_create failed (<e>: <s>)"
//     "HostMemAllocator: ftruncate(memfd, <M>) failed (<e>: <s>)"
//     "HostMemAllocator: ftruncate(hugetlb memfd, <M>) failed (<e>: <s>)"
//     "HostMemAllocator: mmap(memfd, <M>) failed (<e>: <s>)"
//     "HostMemAllocator: mbind(node=<n>) failed (<e>: <s>)"
//     "HostMemAllocator: madvise(MADV_POPULATE_WRITE) failed (<e>: <s>); falling back to manual
//      page touching"
//     "HostMemAllocator: freeing AnonymousShm buffer ptr=<ADDR> while <k> active registration(s)
//      still reference it; deferring munmap/close until deregistration"
//     "HostMemAllocator: munmap failed (<e>: <s>); invalidating handle anyway to prevent a
//      possible double-free of a reused VA range"
//     "HostMemAllocator: deferred munmap failed (<e>: <s>)"
//   and, under both policies, for a handle of another kernel (a harness guarantee, not mori's):
//     "Free of <ADDR>, which no allocator on this kernel owns ..." (above)
// clang-format on
#include "allocator/host_mem_allocator.h"

#include <fcntl.h>
#include <linux/memfd.h>
#include <linux/mempolicy.h>
#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <new>

#include "kernel/syscall_format.h"

namespace umbp {

namespace {

constexpr int kMadvPopulateWrite = 23;  // MADV_POPULATE_WRITE (Linux 5.14); old headers lack it
constexpr int kHugeShift = 26;          // MAP_HUGE_SHIFT == MFD_HUGE_SHIFT
constexpr size_t kMaxMaskBits = 32768;  // the kernel rejects maxnode - 1 > PAGE_SIZE * 8
constexpr size_t kBitsPerLong = sizeof(unsigned long) * CHAR_BIT;

std::string ErrName(int e) {
  const std::string n = errno_symbol(e);
  return n == "E?" ? "errno " + std::to_string(e) : n;
}

std::string Hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%lx",
                static_cast<unsigned long>(reinterpret_cast<uintptr_t>(p)));
  return buf;
}

bool IsPowerOfTwo(size_t v) { return v != 0 && (v & (v - 1)) == 0; }

std::optional<size_t> AlignUp(size_t size, size_t alignment) {
  if (!IsPowerOfTwo(alignment)) return std::nullopt;
  if (size > std::numeric_limits<size_t>::max() - (alignment - 1)) return std::nullopt;
  return (size + alignment - 1) & ~(alignment - 1);
}

int Log2(size_t v) { return __builtin_ctzll(static_cast<unsigned long long>(v)); }

std::string BasePages(size_t page) {
  return page % 1024 == 0 ? std::to_string(page / 1024) + " KiB" : std::to_string(page) + " B";
}

std::string HugeKb(size_t hp) { return std::to_string(hp / 1024) + " kB"; }

std::optional<unsigned long> ParseUlong(const std::string& s) {
  size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  if (i == s.size() || s[i] < '0' || s[i] > '9') return std::nullopt;
  unsigned long v = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) {
    if (v > (std::numeric_limits<unsigned long>::max() - 9) / 10) return std::nullopt;
    v = v * 10 + static_cast<unsigned long>(s[i] - '0');
  }
  return v;
}

// The value after "<key>:" on its own line of a /proc/meminfo-style text.
std::optional<unsigned long> MeminfoField(const std::string& text, const std::string& key) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    if (text.compare(pos, key.size() + 1, key + ":") == 0) {
      return ParseUlong(text.substr(pos + key.size() + 1, eol - pos - key.size() - 1));
    }
    pos = eol + 1;
  }
  return std::nullopt;
}

// "HugePages of <H> kB: free F, total T, reserved R" for the requested size.
std::string HugepageCounters(Kernel& k, size_t hp) {
  const std::string kb = std::to_string(hp / 1024);
  const std::string head = "HugePages of " + kb + " kB: ";
  const std::string dir = "/sys/kernel/mm/hugepages/hugepages-" + kb + "kB/";
  auto read_num = [&](const std::string& name) -> std::optional<unsigned long> {
    FileResult r = k.read_file(dir + name);
    if (!r.ok()) return std::nullopt;
    return ParseUlong(r.data);
  };
  auto fmt = [&](unsigned long f, unsigned long t, unsigned long r) {
    return head + "free " + std::to_string(f) + ", total " + std::to_string(t) + ", reserved " +
           std::to_string(r);
  };
  auto f = read_num("free_hugepages");
  auto t = read_num("nr_hugepages");
  auto r = read_num("resv_hugepages");
  if (f && t && r) return fmt(*f, *t, *r);
  FileResult mi = k.read_file("/proc/meminfo");
  if (!mi.ok()) return head + "counters unavailable";
  auto def = MeminfoField(mi.data, "Hugepagesize");
  if (def && *def == hp / 1024) {
    auto mf = MeminfoField(mi.data, "HugePages_Free");
    auto mt = MeminfoField(mi.data, "HugePages_Total");
    auto mr = MeminfoField(mi.data, "HugePages_Rsvd");
    if (mf && mt && mr) return fmt(*mf, *mt, *mr);
    return head + "counters unavailable";
  }
  if (def) return head + "not configured on this kernel";
  return head + "counters unavailable";
}

// Is `node` in a "%*pbl" node list ("0", "0-3,5")? nullopt if the text cannot be parsed.
std::optional<bool> NodeListContains(const std::string& text, long node) {
  std::string s = text;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  if (s.empty()) return false;
  size_t pos = 0;
  bool found = false;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    if (comma == std::string::npos) comma = s.size();
    std::string part = s.substr(pos, comma - pos);
    size_t dash = part.find('-');
    auto lo = ParseUlong(part.substr(0, dash));
    auto hi = dash == std::string::npos ? lo : ParseUlong(part.substr(dash + 1));
    if (!lo || !hi || *hi < *lo) return std::nullopt;
    if (static_cast<unsigned long>(node) >= *lo && static_cast<unsigned long>(node) <= *hi) {
      found = true;
    }
    pos = comma + 1;
  }
  return found;
}

HostBufferBacking Demoted(HostBufferBacking b) {
  return b == HostBufferBacking::AnonymousShmHugetlb ? HostBufferBacking::AnonymousShm
                                                     : HostBufferBacking::Anonymous;
}

// mori's "(<errno>: <strerror>)".
std::string MoriErr(int e) {
  static std::mutex mu;  // strerror's buffer for unknown values is shared
  std::lock_guard<std::mutex> lock(mu);
  return std::to_string(e) + ": " + std::strerror(e);
}

// mori's ReadHugepageMeminfoSummary: the three /proc/meminfo lines as read, or "<key>=?".
std::string MoriMeminfoSummary(Kernel& k) {
  FileResult mi = k.read_file("/proc/meminfo");
  std::string total = "HugePages_Total=?", free = "HugePages_Free=?", size = "Hugepagesize=?";
  if (!mi.ok()) return total + " " + free + " " + size;
  size_t pos = 0;
  while (pos < mi.data.size()) {
    size_t eol = mi.data.find('\n', pos);
    if (eol == std::string::npos) eol = mi.data.size();
    const std::string line = mi.data.substr(pos, eol - pos);
    if (line.rfind("HugePages_Total:", 0) == 0) total = line;
    if (line.rfind("HugePages_Free:", 0) == 0) free = line;
    if (line.rfind("Hugepagesize:", 0) == 0) size = line;
    pos = eol + 1;
  }
  return total + " " + free + " " + size;
}

// Process-unique allocation serials: a handle of one kernel can never match another's buffer.
uint64_t NextSerial() {
  static std::atomic<uint64_t> serial{0};
  return ++serial;
}

}  // namespace

struct HostMemAllocator::State {
  mutable std::mutex mu;
  std::map<void*, LiveBuffer> live;
  std::map<void*, ShmRegistryEntry> shm;
  // memfds whose close() threw during a Free: closed again at the next Alloc or Free.
  std::vector<int> orphan_fds;
};

std::string BackingName(HostBufferBacking b) {
  switch (b) {
    case HostBufferBacking::Anonymous:
      return "Anonymous";
    case HostBufferBacking::AnonymousHugetlb:
      return "AnonymousHugetlb";
    case HostBufferBacking::AnonymousShm:
      return "AnonymousShm";
    case HostBufferBacking::AnonymousShmHugetlb:
      return "AnonymousShmHugetlb";
  }
  return "Unknown(" + std::to_string(static_cast<int>(b)) + ")";
}

bool IsHugetlb(HostBufferBacking b) {
  return b == HostBufferBacking::AnonymousHugetlb || b == HostBufferBacking::AnonymousShmHugetlb;
}

bool IsShm(HostBufferBacking b) {
  return b == HostBufferBacking::AnonymousShm || b == HostBufferBacking::AnonymousShmHugetlb;
}

HostMemAllocator::HostMemAllocator(KernelPtr kernel, LogSink sink, const AllocatorPolicy& policy)
    : kernel_(std::move(kernel)), sink_(std::move(sink)), policy_(policy) {
  if (!kernel_) return;
  try {
    state_ = kernel_->process_state<State>("umbp::HostMemAllocator");
  } catch (...) {
    state_.reset();  // Alloc then answers with invalid handles
  }
}

HostMemAllocator::~HostMemAllocator() = default;

void HostMemAllocator::Warn(const std::string& text) {
  if (!sink_) return;
  try {
    sink_(LogLevel::Warning, text);
  } catch (...) {
  }
}

void HostMemAllocator::WarnOnce(const std::string& reason,
                                const std::function<std::string()>& text) {
  try {
    if (kernel_->first_time(reason)) Warn(text());
  } catch (...) {
  }
}

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

// One Alloc call: the steps share the kernel, the policy, the outcome and the warnings.
class AllocRun {
 public:
  enum class Status { Ok, Demote, Fail, Crash };

  AllocRun(HostMemAllocator& a, CallOutcome* out)
      : a_(a), k_(*a.kernel_), p_(a.policy_), out_(out), page_(k_.page_size()) {}

  HostBufferHandle Go(size_t size, HostBufferBacking backing, size_t hp, int node, bool prefault) {
    int b = static_cast<int>(backing);
    if (b < 0 || b > 3) {
      Say("Alloc: unknown backing " + std::to_string(b) + "; returning an invalid handle");
      return {};
    }
    if (size == 0) {
      Say("Alloc(size=0): nothing to allocate; returning an invalid handle");
      return {};
    }
    if (IsHugetlb(backing)) {
      const HostBufferBacking to = Demoted(backing);
      if (!IsPowerOfTwo(hp)) {
        if (p_.mori_texts) {
          Warn("HostMemAllocator: invalid hugepage_size=" + std::to_string(hp) +
               (to == HostBufferBacking::AnonymousShm
                    ? "; falling back to AnonymousShm (4 KiB pages)"
                    : "; falling back to anonymous pages"));
        } else {
          a_.WarnOnce("hugepage-size:" + BackingName(to) + ":" + std::to_string(hp), [&] {
            return "hugepage_size " + std::to_string(hp) +
                   " is not a power of two; falling back to " + BasePages(page_) + " pages (" +
                   BackingName(to) + ")";
          });
        }
        backing = to;
      } else if (hp <= page_ && p_.hugepage_size_above_base_page) {
        a_.WarnOnce("hugepage-size:" + BackingName(to) + ":" + std::to_string(hp), [&] {
          return "hugepage_size " + std::to_string(hp) +
                 " cannot be encoded in MAP_HUGE_* (not larger than the " + BasePages(page_) +
                 " base page); falling back to " + BasePages(page_) + " pages (" + BackingName(to) +
                 ")";
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

  bool Crashed(const SysResult& r, const char* where) {
    if (r.signal == 0) return false;
    if (out_) {
      out_->signal = r.signal;
      try {
        out_->where = where;
      } catch (...) {
      }
    }
    return true;
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
      Say("Alloc(size=" + std::to_string(size) + "): rounding up to " +
          (huge ? HugeKb(hp) : BasePages(page_)) + " pages overflows; returning an invalid handle");
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

  std::string HugeFallback(HostBufferBacking backing) {
    return "falling back to " + BasePages(page_) + " pages (" + BackingName(Demoted(backing)) + ")";
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
        if (Crashed(r, "mmap")) return Status::Crash;
        if (!r.ok()) {
          if (huge) {
            return HugeFail("mmap", h, hp, r.error, [&] {
              return "hugetlb mmap of " + ns + " bytes (" + HugeKb(hp) + " pages) failed: ";
            });
          }
          Say("mmap of " + ns + " bytes (Anonymous, " + BasePages(page_) +
              " pages) failed: " + ErrName(r.error) + "; returning an invalid handle");
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
        if (Crashed(fd, "memfd_create")) return Status::Crash;
        if (!fd.ok()) {
          if (huge) {
            return HugeFail("memfd_create", h, hp, fd.error, [&] {
              return "hugetlb memfd_create (" + HugeKb(hp) + " pages) failed: ";
            });
          }
          if (p_.mori_texts) {
            Warn("HostMemAllocator: memfd_create failed (" + MoriErr(fd.error) + ")");
          } else {
            Warn("memfd_create(umbp_host_buffer) failed: " + ErrName(fd.error) +
                 "; returning an invalid handle");
          }
          return Status::Fail;
        }
        h.fd = static_cast<int>(fd.value);
        SysResult t = k_.ftruncate(h.fd, static_cast<off_t>(n));
        if (Crashed(t, "ftruncate")) return Status::Crash;
        if (!t.ok()) {
          if (CloseQuiet(h) == Status::Crash) return Status::Crash;
          if (p_.mori_texts) {
            // mori 264-270, 345-353: said every time, also before the hugetlb fallback.
            const char* what = huge ? "hugetlb memfd" : "memfd";
            Warn(std::string("HostMemAllocator: ftruncate(") + what + ", " + ns + ") failed (" +
                 MoriErr(t.error) + ")");
            return huge ? Status::Demote : Status::Fail;
          }
          if (huge) {
            return HugeFail("ftruncate", h, hp, t.error, [&] {
              return "hugetlb ftruncate of the memfd to " + ns + " bytes (" + HugeKb(hp) +
                     " pages) failed: ";
            });
          }
          Warn("ftruncate of the memfd to " + ns + " bytes failed: " + ErrName(t.error) +
               "; returning an invalid handle");
          return Status::Fail;
        }
        int mflags = MAP_SHARED;
        if (huge && p_.map_hugetlb_on_memfd) mflags |= MAP_HUGETLB;
        SysResult m = k_.mmap(nullptr, n, PROT_READ | PROT_WRITE, mflags, h.fd, 0);
        if (Crashed(m, "mmap")) return Status::Crash;
        if (!m.ok()) {
          if (CloseQuiet(h) == Status::Crash) return Status::Crash;
          if (huge) {
            return HugeFail("mmap", h, hp, m.error, [&] {
              return "hugetlb mmap of " + ns + " bytes (" + HugeKb(hp) + " pages) failed: ";
            });
          }
          if (p_.mori_texts) {
            Warn("HostMemAllocator: mmap(memfd, " + ns + ") failed (" + MoriErr(m.error) + ")");
          } else {
            Warn("mmap of " + ns + " bytes (AnonymousShm, " + BasePages(page_) +
                 " pages) failed: " + ErrName(m.error) + "; returning an invalid handle");
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
  Status HugeFail(const char* step, const HostBufferHandle& h, size_t hp, int err,
                  const std::function<std::string()>& head) {
    const HostBufferBacking backing = h.actual_backing;
    if (p_.one_hugetlb_warning_per_process) {
      a_.WarnOnce("mori:hugetlb-fallback", [&] {
        return "HostMemAllocator: MAP_HUGETLB allocation failed for size=" +
               std::to_string(h.requested_size) + " hugepage_size=" + std::to_string(hp) + " (" +
               MoriErr(err) + "); falling back to anonymous pages. " + MoriMeminfoSummary(k_);
      });
      return Status::Demote;
    }
    a_.WarnOnce("hugetlb:" + BackingName(backing) + ":" + step + ":" + std::to_string(hp) + ":" +
                    ErrName(err),
                [&] {
                  return head() + ErrName(err) + "; " + HugepageCounters(k_, hp) + "; " +
                         HugeFallback(backing);
                });
    return Status::Demote;
  }

  // Close the memfd of a failed step (mori: silently).
  Status CloseQuiet(HostBufferHandle& h) {
    const int fd = h.fd;
    h.fd = -1;
    SysResult c = k_.close(fd);
    if (Crashed(c, "close")) return Status::Crash;
    if (!c.ok()) {
      Say("close(" + std::to_string(fd) +
          ") of a memfd after a failed Alloc step failed: " + ErrName(c.error));
    }
    return Status::Ok;
  }

  // Undo a mapping made by this run (prefault failed).
  Status Unmap(HostBufferHandle& h) {
    SysResult r = k_.munmap(h.ptr, h.mapped_size);
    if (Crashed(r, "munmap")) return Status::Crash;
    if (!r.ok()) {
      Warn("munmap(" + Hex(h.ptr) + ", " + std::to_string(h.mapped_size) +
           ") while cleaning up a failed Alloc failed: " + ErrName(r.error));
    }
    void* const ptr = h.ptr;
    h.ptr = nullptr;
    if (h.fd >= 0) {
      const int fd = h.fd;
      h.fd = -1;
      SysResult c = k_.close(fd);
      if (Crashed(c, "close")) return Status::Crash;
      if (!c.ok()) {
        Warn("close(" + std::to_string(fd) + ") of the memfd of " + Hex(ptr) +
             " failed: " + ErrName(c.error));
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

  Status Bind(HostBufferHandle& h, int node) {
    std::string list;
    if (p_.check_possible_nodes) {
      FileResult possible = k_.read_file("/sys/devices/system/node/possible");
      if (!possible.ok()) {
        a_.WarnOnce("numa:possible", [&] {
          return "numa_node " + std::to_string(node) +
                 " requested but /sys/devices/system/node/possible cannot be read (" +
                 ErrName(possible.error) + "); buffer not bound";
        });
        return Status::Ok;
      }
      list = possible.data;
      while (!list.empty() && (list.back() == '\n' || list.back() == ' ')) list.pop_back();
      auto in = NodeListContains(list, node);
      if (!in) {
        a_.WarnOnce("numa:possible", [&] {
          return "numa_node " + std::to_string(node) +
                 " requested but /sys/devices/system/node/possible cannot be parsed ('" + list +
                 "'); buffer not bound";
        });
        return Status::Ok;
      }
      if (!*in) {
        a_.WarnOnce("numa:outside:" + std::to_string(node), [&] {
          return "numa_node " + std::to_string(node) +
                 " is not a possible NUMA node (possible: " + list + "); buffer not bound";
        });
        return Status::Ok;
      }
    }
    const size_t bit = static_cast<size_t>(node);
    if (p_.cap_nodemask && bit + 1 >= kMaxMaskBits) {
      a_.WarnOnce("numa:outside:" + std::to_string(node), [&] {
        return "numa_node " + std::to_string(node) +
               " is not a possible NUMA node (possible: " + list + "); buffer not bound";
      });
      return Status::Ok;
    }
    const size_t words = bit / kBitsPerLong + 1;
    MaskMemory mask(k_, words);
    mask.data()[bit / kBitsPerLong] = 1UL << (bit % kBitsPerLong);
    // NodePlusTwo: the kernel reads maxnode-1 bits, so bit `node` is among them.
    const unsigned long maxnode = p_.maxnode == AllocatorPolicy::Maxnode::WordBits
                                      ? static_cast<unsigned long>(words * kBitsPerLong)
                                      : static_cast<unsigned long>(node) + 2;
    SysResult r = k_.mbind(h.ptr, h.mapped_size, MPOL_BIND, mask.data(), maxnode, 0);
    if (Crashed(r, "mbind")) return Status::Crash;
    if (!r.ok()) {
      if (p_.mori_texts) {
        if (r.error == ENOSYS) {
          a_.WarnOnce("mori:numa-unavailable", [] {
            return std::string(
                "HostMemAllocator: NUMA binding unavailable on this build; ignoring numa_node");
          });
        } else {
          Warn("HostMemAllocator: mbind(node=" + std::to_string(node) + ") failed (" +
               MoriErr(r.error) + ")");
        }
        return Status::Ok;
      }
      a_.WarnOnce("mbind:" + std::to_string(node) + ":" + ErrName(r.error), [&] {
        return "mbind(MPOL_BIND, node " + std::to_string(node) + ") of " +
               std::to_string(h.mapped_size) + " bytes failed: " + ErrName(r.error) +
               "; buffer not bound to node " + std::to_string(node);
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
    if (Crashed(t, "prefault touch")) return Status::Crash;
    if (!t.ok()) {
      Say("prefault touch of " + std::to_string(h.mapped_size) +
          " bytes failed: " + ErrName(t.error) + "; buffer left unpopulated");
    }
    return Status::Ok;
  }

  Status Prefault(HostBufferHandle& h, int node) {
    SysResult r = k_.madvise(h.ptr, h.mapped_size, kMadvPopulateWrite);
    if (Crashed(r, "madvise(MADV_POPULATE_WRITE)")) return Status::Crash;
    if (r.ok()) return Status::Ok;
    const std::string ns = std::to_string(h.mapped_size);
    if (p_.populate_failure == AllocatorPolicy::PopulateFailure::TouchByHand) {
      Warn("HostMemAllocator: madvise(MADV_POPULATE_WRITE) failed (" + MoriErr(r.error) +
           "); falling back to manual page touching");
      return TouchByHand(h);
    }
    if (r.error == EINVAL) {
      a_.WarnOnce("populate-write-einval", [&] {
        return std::string(
            "madvise(MADV_POPULATE_WRITE) is not supported by this kernel (EINVAL; needs Linux "
            "5.14); prefaulting by touching one byte per page");
      });
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
                    return "MADV_POPULATE_WRITE of " + ns + " bytes (" + HugeKb(hp) +
                           " pages) failed: EFAULT (no free hugepage on the allowed nodes); " +
                           counters + "; unmapped, " + HugeFallback(backing);
                  });
      return Status::Demote;
    }
    const std::string what = "MADV_POPULATE_WRITE of " + ns + " bytes (" +
                             BackingName(h.actual_backing) + ", " + PagesOf(h) +
                             " pages) failed: " + ErrName(r.error) +
                             "; unmapped, returning an invalid handle";
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
      Warn(std::string("Alloc: internal error (") + e.what() + "); returning an invalid handle");
      return {};
    }
  }

  HostMemAllocator& a_;
  Kernel& k_;
  const AllocatorPolicy& p_;
  CallOutcome* out_;
  size_t page_;
};

HostBufferHandle HostMemAllocator::Alloc(size_t size, HostBufferBacking backing,
                                         size_t hugepage_size, int numa_node, bool prefault,
                                         CallOutcome* outcome) {
  if (outcome) {
    outcome->signal = 0;
    outcome->where.clear();
  }
  if (!kernel_ || !state_) {
    Warn("Alloc: no kernel; returning an invalid handle");
    return {};
  }
  try {
    CloseOrphans();
  } catch (...) {
  }
  if (policy_.exceptions_escape) {
    AllocRun run(*this, outcome);
    return run.Go(size, backing, hugepage_size, numa_node, prefault);
  }
  try {
    AllocRun run(*this, outcome);
    return run.Go(size, backing, hugepage_size, numa_node, prefault);
  } catch (const std::exception& e) {
    // What the failed step held was released while unwinding (HeldOnUnwind).
    Warn(std::string("Alloc: internal error (") + e.what() + "); returning an invalid handle");
  } catch (...) {
    Warn("Alloc: internal error (unknown exception); returning an invalid handle");
  }
  return {};
}

// Put back what Free took out of the tables (its munmap threw).
void HostMemAllocator::Restore(const HostBufferHandle& h, size_t len, HostBufferBacking backing,
                               int fd) {
  try {
    std::lock_guard<std::mutex> lock(state_->mu);
    LiveBuffer b;
    b.ptr = h.ptr;
    b.requested_size = h.requested_size;
    b.mapped_size = len;
    b.backing = backing;
    b.alignment = h.actual_alignment;
    b.fd = h.fd;
    b.numa_node = h.numa_node;
    b.serial = h.serial;
    state_->live[h.ptr] = b;
    if (IsShm(backing) && fd >= 0) {
      ShmRegistryEntry e;
      e.base = h.ptr;
      e.mapped_size = len;
      e.fd = fd;
      state_->shm[h.ptr] = e;
    }
  } catch (...) {
  }
}

// close() of a memfd this kernel owns; one that throws is kept for CloseOrphans.
void HostMemAllocator::CloseOwned(int fd, void* ptr, CallOutcome* outcome) {
  SysResult c;
  try {
    c = kernel_->close(fd);
  } catch (...) {
    try {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->orphan_fds.push_back(fd);
    } catch (...) {
    }
    return;
  }
  if (c.signal) {
    if (outcome) {
      outcome->signal = c.signal;
      outcome->where = "close";
    }
    return;
  }
  if (!c.ok() && !policy_.mori_texts) {
    Warn("close(" + std::to_string(fd) + ") of the memfd of " + Hex(ptr) +
         " failed: " + ErrName(c.error));
  }
}

void HostMemAllocator::CloseOrphans() {
  std::vector<int> fds;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    fds.swap(state_->orphan_fds);
  }
  for (int fd : fds) CloseOwned(fd, nullptr, nullptr);
}

namespace {
void Invalidate(HostBufferHandle& handle) {
  handle.ptr = nullptr;
  handle.requested_size = 0;
  handle.mapped_size = 0;
  handle.fd = -1;
  handle.serial = 0;
}
}  // namespace

void HostMemAllocator::Free(HostBufferHandle& handle, CallOutcome* outcome) {
  if (outcome) {
    outcome->signal = 0;
    outcome->where.clear();
  }
  if (!handle.valid() || !kernel_ || !state_) return;
  auto crashed = [&](const SysResult& r, const char* where) {
    if (!r.signal) return false;
    if (outcome) {
      outcome->signal = r.signal;
      outcome->where = where;
    }
    return true;
  };
  try {
    CloseOrphans();
    void* ptr = handle.ptr;
    size_t len = handle.mapped_size;
    HostBufferBacking backing = handle.actual_backing;
    bool known = handle.kernel_id == 0 || handle.kernel_id == kernel_->id();
    bool defer = false;
    size_t holders = 0;
    int fd_to_close = -1;
    if (known) {
      std::lock_guard<std::mutex> lock(state_->mu);
      auto it = state_->live.find(handle.ptr);
      const bool live =
          it != state_->live.end() && (handle.serial == 0 || it->second.serial == handle.serial);
      if (policy_.free_trusts_handle) {
        // mori 451-494: the handle's address and size; the registry record at that address.
        if (it != state_->live.end()) state_->live.erase(it);
      } else if (!live) {
        known = false;
      } else {
        len = it->second.mapped_size;
        backing = it->second.backing;
        fd_to_close = it->second.fd;
        state_->live.erase(it);
      }
      if (known && IsShm(backing)) {
        fd_to_close = -1;
        auto sit = state_->shm.find(ptr);
        if (sit != state_->shm.end()) {
          if (sit->second.active_registrations > 0) {
            sit->second.pending_free = true;
            defer = true;
            holders = sit->second.active_registrations;
          } else {
            fd_to_close = sit->second.fd;
            state_->shm.erase(sit);
          }
        }
      }
    }
    if (!known) {
      Warn("Free of " + Hex(handle.ptr) +
           ", which no allocator on this kernel owns (freed through a copy of its handle, or "
           "allocated on another kernel); nothing unmapped, handle unchanged");
      return;
    }
    const HostBufferHandle before = handle;
    Invalidate(handle);
    if (defer) {
      if (policy_.mori_texts) {
        Warn("HostMemAllocator: freeing AnonymousShm buffer ptr=" + Hex(ptr) + " while " +
             std::to_string(holders) +
             " active registration(s) still reference it; deferring munmap/close until "
             "deregistration");
      } else {
        Warn("Free of " + BackingName(backing) + " buffer " + Hex(ptr) + " (" +
             std::to_string(len) + " bytes) while " + std::to_string(holders) +
             " registration(s) hold it; munmap and close deferred to the last "
             "ReleaseShmAllocation");
      }
      return;
    }
    SysResult r;
    try {
      r = kernel_->munmap(ptr, len);
    } catch (const std::exception& e) {
      // Nothing was released: the buffer stays owned and the handle valid, so Free can retry.
      handle = before;
      Restore(before, len, backing, fd_to_close);
      Warn("Free of " + Hex(ptr) + ": internal error in munmap (" + e.what() +
           "); nothing released, the handle stays valid");
      return;
    }
    if (crashed(r, "munmap")) return;
    if (!r.ok()) {
      if (policy_.mori_texts) {
        Warn("HostMemAllocator: munmap failed (" + MoriErr(r.error) +
             "); invalidating handle anyway to prevent a possible double-free of a reused VA "
             "range");
      } else {
        Warn("munmap(" + Hex(ptr) + ", " + std::to_string(len) + ") failed: " + ErrName(r.error) +
             "; handle invalidated anyway so a later Free cannot unmap a reused address");
      }
    }
    if (fd_to_close >= 0) CloseOwned(fd_to_close, ptr, outcome);
  } catch (...) {
    // Only a warning's string building can throw here; the handle state is already settled.
  }
}

namespace {
template <typename Map>
typename Map::iterator FindContaining(Map& shm, uintptr_t ptr, size_t size) {
  if (ptr == 0 || size == 0) return shm.end();
  if (ptr > std::numeric_limits<uintptr_t>::max() - (size - 1)) return shm.end();
  auto it = shm.upper_bound(reinterpret_cast<void*>(ptr));
  if (it == shm.begin()) return shm.end();
  --it;
  const uintptr_t base = reinterpret_cast<uintptr_t>(it->first);
  const uintptr_t end = base + it->second.mapped_size;
  if (ptr < base || ptr + size > end || it->second.fd < 0 || it->second.pending_free) {
    return shm.end();
  }
  return it;
}
}  // namespace

std::optional<HostMemAllocator::ShmAllocation> HostMemAllocator::LookupShmAllocation(uintptr_t ptr,
                                                                                     size_t size) {
  if (!state_) return std::nullopt;
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = FindContaining(state_->shm, ptr, size);
  if (it == state_->shm.end()) return std::nullopt;
  return ShmAllocation{it->first, it->second.mapped_size, it->second.fd};
}

std::optional<HostMemAllocator::ShmAllocation> HostMemAllocator::AcquireShmAllocation(uintptr_t ptr,
                                                                                      size_t size) {
  if (!state_) return std::nullopt;
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = FindContaining(state_->shm, ptr, size);
  if (it == state_->shm.end()) return std::nullopt;
  ++it->second.active_registrations;
  return ShmAllocation{it->first, it->second.mapped_size, it->second.fd};
}

void HostMemAllocator::ReleaseShmAllocation(uintptr_t base, CallOutcome* outcome) {
  if (outcome) {
    outcome->signal = 0;
    outcome->where.clear();
  }
  if (!state_) return;
  try {
    void* ptr = nullptr;
    size_t len = 0;
    int fd = -1;
    enum { kOk, kUnknown, kUnmatched } status = kOk;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      auto it = state_->shm.find(reinterpret_cast<void*>(base));
      if (it == state_->shm.end()) {
        status = kUnknown;
      } else if (it->second.active_registrations == 0) {
        status = kUnmatched;
      } else if (--it->second.active_registrations == 0 && it->second.pending_free) {
        ptr = it->first;
        len = it->second.mapped_size;
        fd = it->second.fd;
        state_->shm.erase(it);
      }
    }
    const std::string where = Hex(reinterpret_cast<void*>(base));
    if (status != kOk && policy_.mori_texts) return;  // mori 554-555: silently ignored
    if (status == kUnknown) {
      Warn("ReleaseShmAllocation(" + where + "): no shm allocation is based there; ignored");
      return;
    }
    if (status == kUnmatched) {
      Warn("ReleaseShmAllocation(" + where + ") without a matching AcquireShmAllocation; ignored");
      return;
    }
    if (!ptr) return;
    SysResult r = kernel_->munmap(ptr, len);
    if (r.signal) {
      if (outcome) {
        outcome->signal = r.signal;
        outcome->where = "munmap";
      }
      return;
    }
    if (!r.ok()) {
      if (policy_.mori_texts) {
        Warn("HostMemAllocator: deferred munmap failed (" + MoriErr(r.error) + ")");
      } else {
        Warn("deferred munmap(" + Hex(ptr) + ", " + std::to_string(len) +
             ") at the last ReleaseShmAllocation failed: " + ErrName(r.error));
      }
    }
    if (fd >= 0) CloseOwned(fd, ptr, outcome);
  } catch (...) {
  }
}

AllocatorSnapshot HostMemAllocator::Snapshot() const {
  AllocatorSnapshot s;
  if (!state_) return s;
  try {
    std::lock_guard<std::mutex> lock(state_->mu);
    for (const auto& kv : state_->live) s.live.push_back(kv.second);
    for (const auto& kv : state_->shm) s.shm.push_back(kv.second);
  } catch (...) {
    return AllocatorSnapshot{};
  }
  return s;
}

}  // namespace umbp
