// libumbp_sim_interpose.so: routes an allocator's OS calls to a umbp_sim_kernel (see
// csrc/capi/umbp_sim/interposer.h for what is routed and when). No dependency on umbp-sim's
// C++ core: the Kernel is reached only through the C ABI.
#include "umbp_sim/interposer.h"

#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <link.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <mutex>

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif
#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1  // Linux 5.11: handle user-mode faults only (no privilege needed)
#endif
#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC_NEW _IO(0xAA, 0x00)  // Linux 6.1: /dev/userfaultfd
#endif

namespace {

// ---- the real functions ------------------------------------------------------------------

using mmap_fn = void* (*)(void*, size_t, int, int, int, off_t);
using munmap_fn = int (*)(void*, size_t);
using madvise_fn = int (*)(void*, size_t, int);
using mbind_fn = long (*)(void*, unsigned long, int, const unsigned long*, unsigned long, unsigned);
using memfd_fn = int (*)(const char*, unsigned);
using ftruncate_fn = int (*)(int, off_t);
using close_fn = int (*)(int);
using sysconf_fn = long (*)(int);
using syscall_fn = long (*)(long, ...);
using open_fn = int (*)(const char*, int, ...);
using openat_fn = int (*)(int, const char*, int, ...);
using open2_fn = int (*)(const char*, int);
using openat2_fn = int (*)(int, const char*, int);
using fopen_fn = FILE* (*)(const char*, const char*);

template <typename F>
F real(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

// The real function `name`, looked up once into *cache.
template <typename F>
F cached(std::atomic<void*>* cache, const char* name) {
  void* f = cache->load(std::memory_order_relaxed);
  if (!f) {
    f = dlsym(RTLD_NEXT, name);
    cache->store(f, std::memory_order_relaxed);
  }
  return reinterpret_cast<F>(f);
}

// Real calls that never come back into this library (it defines syscall, mmap, close...).
long raw(long nr, long a1 = 0, long a2 = 0, long a3 = 0, long a4 = 0, long a5 = 0, long a6 = 0) {
  static syscall_fn f = real<syscall_fn>("syscall");
  return f(nr, a1, a2, a3, a4, a5, a6);
}
long L(const void* p) { return reinterpret_cast<long>(p); }
void* sys_mmap(void* a, size_t n, int prot, int flags, int fd, off_t off) {
  return reinterpret_cast<void*>(raw(SYS_mmap, L(a), static_cast<long>(n), prot, flags, fd, off));
}
int sys_mprotect(void* a, size_t n, int prot) {
  return static_cast<int>(raw(SYS_mprotect, L(a), static_cast<long>(n), prot));
}
void* sys_mremap(void* a, size_t n, size_t m, int flags, void* to) {
  return reinterpret_cast<void*>(
      raw(SYS_mremap, L(a), static_cast<long>(n), static_cast<long>(m), flags, L(to)));
}
int sys_close(int fd) { return static_cast<int>(raw(SYS_close, fd)); }
int sys_ioctl(int fd, unsigned long req, void* arg) {
  return static_cast<int>(raw(SYS_ioctl, fd, static_cast<long>(req), L(arg)));
}

// ---- state -------------------------------------------------------------------------------

std::atomic<const umbp_sim_kernel*> g_kernel{nullptr};
umbp_sim_kernel g_kernel_copy;  // the handle activate() was given (ops + self), retained
bool g_simulated = false;
size_t g_page = 4096;

__thread int t_scope = 0;

constexpr int kMaxRanges = 256;
struct Range {
  uintptr_t lo, hi;
};
Range g_callers[kMaxRanges];
std::atomic<int> g_ncallers{0};

std::atomic<unsigned long> g_routed{0}, g_faults{0}, g_moved{0};

// Simulated fds (from the Kernel's memfd_create).
constexpr int kMaxFds = 1024;
std::mutex g_fd_mu;
int g_fds[kMaxFds];
std::atomic<int> g_nfds{0};

bool is_sim_fd(int fd) {
  if (g_nfds.load(std::memory_order_relaxed) == 0) return false;
  std::lock_guard<std::mutex> l(g_fd_mu);
  for (int i = 0, n = g_nfds.load(); i < n; ++i)
    if (g_fds[i] == fd) return true;
  return false;
}
void add_sim_fd(int fd) {
  std::lock_guard<std::mutex> l(g_fd_mu);
  int n = g_nfds.load();
  if (n < kMaxFds) {
    g_fds[n] = fd;
    g_nfds.store(n + 1);
  }
}
void drop_sim_fd(int fd) {
  std::lock_guard<std::mutex> l(g_fd_mu);
  int n = g_nfds.load();
  for (int i = 0; i < n; ++i)
    if (g_fds[i] == fd) {
      g_fds[i] = g_fds[n - 1];
      g_nfds.store(n - 1);
      return;
    }
}

// Simulated mappings (their real pages are PROT_NONE except granted runs) and granted runs.
constexpr int kMaxMaps = 8192;
constexpr int kMaxGrants = 16384;
// A "big" grant: one aligned 32 MiB block (16 THPs). A page-by-page touch of a huge buffer costs
// one trap (signal, Kernel touch, mremap, refill) per grant: 32 MiB blocks make that a fifth of
// its time (1.5 TiB: 49k traps), and one block fits the default resident limit.
constexpr size_t kBig = size_t{32} << 20;
// Other grants (a run growing towards a big block, the tail of a mapping) stay this small, so
// real memory stays within the limit: big block + small grants.
constexpr size_t kSmallMax = size_t{2} << 20;
struct Map {
  uintptr_t start, end;
  int prot;
  uintptr_t next_seq;  // end of the last grant: a fault there is sequential
  size_t run;          // current grant size
  bool uffd;           // trapped by userfaultfd (registered, real prot), else PROT_NONE
};
struct Grant {
  uintptr_t start, end;
  bool big;
};
std::mutex g_map_mu;  // guards g_maps, g_grants, g_res_*
Map g_maps[kMaxMaps];
int g_nmaps = 0;
Grant g_grants[kMaxGrants];  // FIFO, oldest first
int g_ngrants = 0;
size_t g_res_big = 0, g_res_small = 0;
size_t g_resident_limit = size_t{48} << 20;  // one big block (3/4) + small grants (1/4)

struct sigaction g_old_segv;
bool g_handler_installed = false;

// How touches of simulated mappings reach the Kernel (umbp_sim_interposer_set_fault_path).
// userfaultfd: mappings stay at their real protection, registered for missing-page faults; a
// resolver thread asks the Kernel and fills the run (UFFDIO_COPY for a write, UFFDIO_ZEROPAGE
// for a read) or moves an old block there, exactly the grants of the SIGSEGV path. The SIGSEGV
// handler stays installed: a simulated death is handed to the faulting thread through it.
int g_want_path = UMBP_SIM_FAULT_PATH_AUTO;         // for the next activate()
std::atomic<int> g_path{UMBP_SIM_FAULT_PATH_NONE};  // the active one
int g_uffd = -1;
int g_stop_fd = -1;  // eventfd: the resolver thread's stop signal
pthread_t g_resolver;
bool g_resolver_running = false;
void* g_zero_src = nullptr;
char g_uffd_why[256];  // why the last start of the userfaultfd path failed  // kCopyChunk bytes of
                       // never-written (zero-page) memory
constexpr size_t kCopyChunk = size_t{2} << 20;
// A simulated death found by the resolver thread: the faulting thread's next touch of this page
// traps (the page is made PROT_NONE) and its SIGSEGV handler dies of g_death_sig there.
std::atomic<uintptr_t> g_death_page{0};
std::atomic<int> g_death_sig{0};

uintptr_t align_down(uintptr_t v, uintptr_t a) { return v / a * a; }
uintptr_t align_up(uintptr_t v, uintptr_t a) { return (v + a - 1) / a * a; }

// Objects that forward an interposed call to us from someone else's: sanitizer runtimes
// (libasan's mmap interceptor calls the next mmap, ours). Their caller is the real caller.
Range g_forwarders[kMaxRanges];
std::atomic<int> g_nforwarders{0};
Range g_self{0, 0};  // this library's code

bool in(const Range* rs, int n, uintptr_t r) {
  for (int i = 0; i < n; ++i)
    if (r >= rs[i].lo && r < rs[i].hi) return true;
  return false;
}

bool caller_ok(void* ret) {
  const auto r = reinterpret_cast<uintptr_t>(ret);
  const int n = g_ncallers.load(std::memory_order_acquire);
  if (in(g_callers, n, r)) return true;
  const int nf = g_nforwarders.load(std::memory_order_acquire);
  if (nf == 0 || !in(g_forwarders, nf, r)) return false;
  // Called through a forwarder: the first frame outside it and outside us is the caller.
  void* frames[16];
  const int depth = backtrace(frames, 16);
  for (int i = 0; i < depth; ++i) {
    const auto f = reinterpret_cast<uintptr_t>(frames[i]);
    if ((f >= g_self.lo && f < g_self.hi) || in(g_forwarders, nf, f)) continue;
    return in(g_callers, n, f);
  }
  return false;
}

// Executable segments of the loaded objects whose name matches `pred`, into `out`.
template <typename Pred>
int collect_ranges(Pred pred, Range* out, std::atomic<int>* count) {
  struct Ctx {
    Pred* pred;
    Range* out;
    std::atomic<int>* count;
    int added;
  } ctx{&pred, out, count, 0};
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, size_t, void* data) -> int {
        auto* c = static_cast<Ctx*>(data);
        if (!info->dlpi_name || !(*c->pred)(info)) return 0;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X)) continue;
          const int n = c->count->load();
          if (n >= kMaxRanges) break;
          const uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
          c->out[n] = Range{lo, lo + ph.p_memsz};
          c->count->store(n + 1, std::memory_order_release);
          ++c->added;
        }
        return 0;
      },
      &ctx);
  return ctx.added;
}

void find_forwarders() {
  if (g_nforwarders.load() > 0) return;
  collect_ranges(
      [](dl_phdr_info* info) {
        const char* base = strrchr(info->dlpi_name, '/');
        base = base ? base + 1 : info->dlpi_name;
        return strncmp(base, "libasan", 7) == 0 || strncmp(base, "libtsan", 7) == 0 ||
               strncmp(base, "libubsan", 8) == 0 || strncmp(base, "liblsan", 7) == 0 ||
               strncmp(base, "libclang_rt.", 12) == 0;
      },
      g_forwarders, &g_nforwarders);
  Dl_info me;
  if (dladdr(reinterpret_cast<void*>(&find_forwarders), &me) && me.dli_fbase) {
    std::atomic<int> one{0};
    Range r[kMaxRanges];
    const auto base = reinterpret_cast<uintptr_t>(me.dli_fbase);
    collect_ranges([base](dl_phdr_info* info) { return info->dlpi_addr == base; }, r, &one);
    if (one.load() > 0) g_self = r[0];
  }
  if (g_nforwarders.load() > 0) {
    void* warm[2];
    backtrace(warm, 2);  // loads the unwinder now, not inside an interposed call
  }
}

// The Kernel when this call is the allocator's (wrapped: its object; preload: its caller).
const umbp_sim_kernel* route(bool wrapped, void* ret) {
  const umbp_sim_kernel* k = g_kernel.load(std::memory_order_acquire);
  if (!k || t_scope <= 0) return nullptr;
  if (!wrapped && !caller_ok(ret)) return nullptr;
  g_routed.fetch_add(1, std::memory_order_relaxed);
  return k;
}

const umbp_sim_kernel* kernel_for_fd(int fd) {
  const umbp_sim_kernel* k = g_kernel.load(std::memory_order_acquire);
  if (!k || !is_sim_fd(fd)) return nullptr;
  g_routed.fetch_add(1, std::memory_order_relaxed);
  return k;
}

// ---- crash -------------------------------------------------------------------------------

void put(const char* s, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(2, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}
void put(const char* s) { put(s, strlen(s)); }

void print_describe(const umbp_sim_kernel* k, int what) {
  char small[512];
  size_t n = k->ops->describe(k->self, what, small, sizeof small);
  if (n < sizeof small) {
    put(small, n);
    return;
  }
  char* big = static_cast<char*>(malloc(n + 1));
  if (!big) {
    put(small, sizeof small - 1);
    return;
  }
  k->ops->describe(k->self, what, big, n + 1);
  put(big, n);
  free(big);
}

const char* sig_name(int sig) {
  switch (sig) {
    case SIGBUS:
      return "SIGBUS";
    case SIGKILL:
      return "SIGKILL";
    case SIGSEGV:
      return "SIGSEGV";
    default:
      return "a signal";
  }
}

struct DeathReport {
  const umbp_sim_kernel* k;
  int sig;
  const char* stage;
};

// What happened, the reasons and the trace, on stderr.
void report_death(const DeathReport& d) {
  const umbp_sim_kernel* k = d.k;
  const int sig = d.sig;
  const char* stage = d.stage;
  put("umbp-sim: simulated ");
  put(sig_name(sig));
  put(" (");
  put(stage);
  put("): ");
  char probe[2];
  if (k->ops->describe(k->self, 0, probe, sizeof probe) == 0)
    put("injected");
  else
    print_describe(k, 0);
  put("\n");
  if (k->ops->describe(k->self, 2, probe, sizeof probe) > 0) {
    // SimKernel's reasons (JSON lines): what a replay explains the death with.
    put("umbp-sim: reasons:\n");
    print_describe(k, 2);
    put("umbp-sim: end of reasons\n");
  }
  put("umbp-sim: syscall trace:\n");
  print_describe(k, 1);
  put("umbp-sim: end of trace\n");
}

void* report_death_thread(void* arg) {
  report_death(*static_cast<const DeathReport*>(arg));
  return nullptr;
}

// The Kernel says the process is dead: print what happened and the trace, then die of it.
[[noreturn]] void die_of(const umbp_sim_kernel* k, int sig, const char* stage) {
  DeathReport d{k, sig, stage};
  // From a fault the SIGSEGV handler runs on the thread's alternate signal stack (Python's
  // faulthandler gives it about 8 KiB): too small for the Kernel's formatting, more so under
  // ASan. The report is then written by a thread with a stack of its own; the faulting thread
  // waits for it and dies.
  stack_t cur;
  bool written = false;
  if (sigaltstack(nullptr, &cur) == 0 && (cur.ss_flags & SS_ONSTACK)) {
    pthread_attr_t attr;
    pthread_t t;
    if (pthread_attr_init(&attr) == 0) {
      pthread_attr_setstacksize(&attr, size_t{1} << 20);
      sigset_t all, old;
      sigfillset(&all);
      pthread_sigmask(SIG_SETMASK, &all, &old);
      written = pthread_create(&t, &attr, report_death_thread, &d) == 0;
      pthread_sigmask(SIG_SETMASK, &old, nullptr);
      if (written) pthread_join(t, nullptr);
      pthread_attr_destroy(&attr);
    }
  }
  if (!written) report_death(d);
  if (sig == SIGSEGV) {
    // A real SIGSEGV goes to whoever handled SIGSEGV before us.
    sigaction(SIGSEGV, &g_old_segv, nullptr);
  }
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  sigprocmask(SIG_UNBLOCK, &set, nullptr);
  raise(sig);  // the previous handler (faulthandler) runs and re-raises, or the default kills
  signal(sig, SIG_DFL);
  raise(sig);
  _exit(128 + sig);
}

int fail(const umbp_sim_kernel* k, const umbp_sim_result& r, const char* stage) {
  if (r.signal) die_of(k, r.signal, stage);
  errno = r.error;
  return -1;
}

// ---- simulated mappings ------------------------------------------------------------------

Map* find_map(uintptr_t a) {
  for (int i = 0; i < g_nmaps; ++i)
    if (a >= g_maps[i].start && a < g_maps[i].end) return &g_maps[i];
  return nullptr;
}

void add_map(uintptr_t start, uintptr_t end, int prot, bool uffd) {
  if (g_nmaps >= kMaxMaps) return;
  g_maps[g_nmaps++] = Map{start, end, prot, 0, 0, uffd};
}

void erase_grant(int i) {
  const Grant& g = g_grants[i];
  (g.big ? g_res_big : g_res_small) -= g.end - g.start;
  memmove(&g_grants[i], &g_grants[i + 1], sizeof(Grant) * static_cast<size_t>(g_ngrants - i - 1));
  --g_ngrants;
}

void push_grant(uintptr_t start, uintptr_t end, bool big) {
  if (g_ngrants == kMaxGrants) erase_grant(0);  // table full: forget the oldest (stays mapped)
  g_grants[g_ngrants++] = Grant{start, end, big};
  (big ? g_res_big : g_res_small) += end - start;
}

// Forget [lo, hi) in the mapping and grant tables (its real pages are being replaced). What is
// left of a big grant cut in part becomes small grants.
void forget_range(uintptr_t lo, uintptr_t hi) {
  for (int i = 0; i < g_ngrants;) {
    const Grant g = g_grants[i];
    if (g.end <= lo || g.start >= hi) {
      ++i;
      continue;
    }
    erase_grant(i);
    if (g.start < lo) push_grant(g.start, lo, false);
    if (g.end > hi) push_grant(hi, g.end, false);
  }
  for (int i = 0; i < g_nmaps;) {
    Map& m = g_maps[i];
    if (m.end <= lo || m.start >= hi) {
      ++i;
      continue;
    }
    if (m.start < lo && m.end > hi) {
      const Map tail{hi, m.end, m.prot, 0, 0, m.uffd};
      m.end = lo;
      add_map(tail.start, tail.end, tail.prot, tail.uffd);
      ++i;
    } else if (m.start < lo) {
      m.end = lo;
      ++i;
    } else if (m.end > hi) {
      m.start = hi;
      ++i;
    } else {
      g_maps[i] = g_maps[--g_nmaps];
    }
  }
}

long raw_madvise(uintptr_t a, size_t n, int advice) {
  return raw(SYS_madvise, static_cast<long>(a), static_cast<long>(n), advice);
}

// ---- userfaultfd -------------------------------------------------------------------------

bool uffd_register(uintptr_t start, size_t len) {
  uffdio_register r;
  memset(&r, 0, sizeof r);
  r.range.start = start;
  r.range.len = len;
  r.mode = UFFDIO_REGISTER_MODE_MISSING;
  return sys_ioctl(g_uffd, UFFDIO_REGISTER, &r) == 0;
}

void uffd_wake(uintptr_t start, size_t len) {
  uffdio_range r{start, len};
  sys_ioctl(g_uffd, UFFDIO_WAKE, &r);
}

// Real pages for the missing range [start, end) of a registered mapping: zeroed private pages
// (UFFDIO_COPY from never-written memory) for a write, the zero page (UFFDIO_ZEROPAGE) for a
// read. Pages already there are skipped. The faulting thread is woken by the caller.
bool uffd_fill(uintptr_t start, uintptr_t end, bool write) {
  int again = 0;
  for (uintptr_t a = start; a < end;) {
    const size_t n = std::min<size_t>(end - a, kCopyChunk);
    long done;
    int rc;
    if (write) {
      uffdio_copy c{a, reinterpret_cast<uintptr_t>(g_zero_src), n, UFFDIO_COPY_MODE_DONTWAKE, 0};
      rc = sys_ioctl(g_uffd, UFFDIO_COPY, &c);
      done = static_cast<long>(c.copy);
    } else {
      uffdio_zeropage z{{a, n}, UFFDIO_ZEROPAGE_MODE_DONTWAKE, 0};
      rc = sys_ioctl(g_uffd, UFFDIO_ZEROPAGE, &z);
      done = static_cast<long>(z.zeropage);
    }
    if (rc == 0) {
      a += n;
    } else if (done > 0) {
      a += static_cast<uintptr_t>(done);  // partly done: go on from there
    } else if (errno == EEXIST) {
      a += g_page;  // already there (another thread's fault resolved it)
    } else if (errno != EAGAIN || ++again > 1000) {
      return false;
    }
  }
  return true;
}

// A userfaultfd, API handshake done, or -1 and why in `why`. First those that also take the
// faults of the kernel's own accesses (a read() into an untouched simulated page is resolved as
// in the field, not EFAULT): the plain syscall (root, vm.unprivileged_userfaultfd), then
// /dev/userfaultfd (6.1, its file mode decides); then the syscall for user-mode faults only
// (no privilege needed since 5.11).
int open_uffd(char* why, size_t cap) {
  const long flags = O_CLOEXEC | O_NONBLOCK;
  int fd = static_cast<int>(raw(SYS_userfaultfd, flags));
  int sys_errno = errno;
  int dev_errno = 0;
  if (fd < 0) {
    const int dev =
        static_cast<int>(raw(SYS_openat, AT_FDCWD, L("/dev/userfaultfd"), O_RDWR | O_CLOEXEC));
    if (dev >= 0) {
      fd = static_cast<int>(raw(SYS_ioctl, dev, static_cast<long>(USERFAULTFD_IOC_NEW), flags));
      dev_errno = errno;
      sys_close(dev);
    } else {
      dev_errno = errno;
    }
  }
  if (fd < 0) {
    fd = static_cast<int>(raw(SYS_userfaultfd, flags | UFFD_USER_MODE_ONLY));
    if (fd < 0 && errno != EINVAL) sys_errno = errno;  // EINVAL: a kernel before the flag
  }
  if (fd < 0) {
    snprintf(why, cap, "userfaultfd(2): %s; /dev/userfaultfd: %s", strerror(sys_errno),
             strerror(dev_errno));
    return -1;
  }
  uffdio_api api;
  memset(&api, 0, sizeof api);
  api.api = UFFD_API;
  const bool ok = sys_ioctl(fd, UFFDIO_API, &api) == 0;
  const __u64 need = (__u64{1} << _UFFDIO_REGISTER) | (__u64{1} << _UFFDIO_UNREGISTER);
  if (!ok || (api.ioctls & need) != need) {
    snprintf(why, cap, "UFFDIO_API: %s", ok ? "no UFFDIO_REGISTER" : strerror(errno));
    sys_close(fd);
    return -1;
  }
  return fd;
}

// Real pages for [start, end) of mapping `m`, within the resident limit. A big grant (an aligned
// 32 MiB block) takes fresh memory until big grants fill 3/4 of the limit, then the pages of the
// oldest big grant are moved here (mremap moves the page table, a transparent hugepage in one
// entry; contents go with them, nothing is zeroed). A small grant takes fresh pages; the oldest
// small grants are dropped (MADV_DONTNEED) to stay within the rest of the limit. Fresh memory is
// made accessible (PROT_NONE path) or filled (userfaultfd path, `write`: the faulting access).
bool grant(const Map& m, uintptr_t start, uintptr_t end, bool write) {
  const int prot = m.prot & (PROT_READ | PROT_WRITE | PROT_EXEC);
  const size_t len = end - start;
  const bool big = start % kBig == 0 && len == kBig;
  const size_t big_limit = g_resident_limit / 4 * 3;
  const size_t small_limit = g_resident_limit - big_limit;
  auto fresh = [&] {
    if (!m.uffd) return sys_mprotect(reinterpret_cast<void*>(start), len, prot) == 0;
    if (!big) return uffd_fill(start, end, write);
    // A big block leaves the registration instead: the real kernel fills it with transparent
    // hugepages (16 faults), which later moves take as 16 page-table entries (filled here with
    // UFFDIO_COPY it would be 8192 small pages, and every move of it 8192 entries).
    uffdio_range r{start, len};
    if (sys_ioctl(g_uffd, UFFDIO_UNREGISTER, &r) != 0) return false;
    raw_madvise(start, len, MADV_HUGEPAGE);
    return true;
  };
  if (big) {
    int oldest = -1;
    if (g_res_big + kBig > big_limit)
      for (int i = 0; i < g_ngrants && oldest < 0; ++i)
        if (g_grants[i].big) oldest = i;
    if (oldest < 0) {
      if (!fresh()) return false;
      push_grant(start, end, true);
      return true;
    }
    const uintptr_t from = g_grants[oldest].start;
    void* src = reinterpret_cast<void*>(from);
    void* dst = reinterpret_cast<void*>(start);
    if (sys_mremap(src, kBig, kBig, MREMAP_MAYMOVE | MREMAP_FIXED, dst) == MAP_FAILED) return false;
    // The source is a hole now: fill it back as untouched space (a fresh VMA that merges with
    // its neighbours, so the number of real VMAs stays bounded): PROT_NONE, or registered.
    const Map* owner = find_map(from);
    if (owner && owner->uffd) {
      sys_mmap(src, kBig, owner->prot & (PROT_READ | PROT_WRITE | PROT_EXEC),
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
      raw_madvise(from, kBig, MADV_NOHUGEPAGE);  // as its registered neighbours (see trap)
      uffd_register(from, kBig);
    } else {
      sys_mmap(src, kBig, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
               0);
      raw_madvise(from, kBig, MADV_HUGEPAGE);
    }
    if (prot != (PROT_READ | PROT_WRITE)) sys_mprotect(dst, kBig, prot);
    g_moved.fetch_add(1, std::memory_order_relaxed);
    erase_grant(oldest);
    push_grant(start, end, true);
    return true;
  }
  while (g_res_small + len > small_limit) {
    int oldest = -1;
    for (int i = 0; i < g_ngrants && oldest < 0; ++i)
      if (!g_grants[i].big) oldest = i;
    if (oldest < 0) break;
    const Grant g = g_grants[oldest];
    raw_madvise(g.start, g.end - g.start, MADV_DONTNEED);
    const Map* owner = find_map(g.start);
    if (owner && owner->uffd)
      uffd_register(g.start, g.end - g.start);  // missing again (a moved block's rest: re-register)
    else
      sys_mprotect(reinterpret_cast<void*>(g.start), g.end - g.start, PROT_NONE);
    erase_grant(oldest);
  }
  if (!fresh()) return false;
  push_grant(start, end, false);
  return true;
}

// A fault at `addr` inside simulated mapping `m` (g_map_mu held; a SIGSEGV on the PROT_NONE
// path, a missing page on the userfaultfd path; `write`: the access): ask the Kernel, grant.
// Sequential faults grant runs that double up to an aligned 32 MiB block (other grants: at most
// 2 MiB). Returns 0 with the run granted in *granted_end, or the signal the Kernel answered with.
int handle_fault(const umbp_sim_kernel* k, Map& m, uintptr_t addr, bool write,
                 uintptr_t* granted_end) {
  const uintptr_t p = align_down(addr, g_page);
  m.run = (m.next_seq == p && m.run) ? std::min(m.run * 2, kBig) : g_page;
  uintptr_t end = std::min<uintptr_t>(align_down(p, m.run) + m.run, m.end);
  if (end <= p) end = std::min<uintptr_t>(p + g_page, m.end);
  if (!(p % kBig == 0 && end - p == kBig)) end = std::min<uintptr_t>(end, p + kSmallMax);
  for (int i = 0; i < g_ngrants; ++i)  // never over an existing grant
    if (g_grants[i].start > p && g_grants[i].start < end) end = g_grants[i].start;
  umbp_sim_result r = k->ops->touch(k->self, reinterpret_cast<void*>(p), end - p, g_page);
  if (r.signal) return r.signal;
  if (r.error) return SIGSEGV;
  if (!grant(m, p, end, write)) return SIGSEGV;
  m.next_seq = end;
  *granted_end = end;
  g_faults.fetch_add(1, std::memory_order_relaxed);
  return 0;
}

void chain_segv(int sig, siginfo_t* si, void* uc) {
  if (g_old_segv.sa_flags & SA_SIGINFO) {
    if (g_old_segv.sa_sigaction) {
      g_old_segv.sa_sigaction(sig, si, uc);
      return;
    }
  } else if (g_old_segv.sa_handler != SIG_DFL && g_old_segv.sa_handler != SIG_IGN) {
    g_old_segv.sa_handler(sig);
    return;
  }
  // Default: return with the default action in place; the access faults again and kills.
  signal(SIGSEGV, SIG_DFL);
}

void on_segv(int sig, siginfo_t* si, void* uc) {
  const int saved = errno;
  const umbp_sim_kernel* k = g_kernel.load(std::memory_order_acquire);
  const auto addr = reinterpret_cast<uintptr_t>(si->si_addr);
  if (k && g_simulated && si->si_code == SEGV_ACCERR) {
    int dead = -1;
    if (g_death_page.load(std::memory_order_acquire) == align_down(addr, g_page)) {
      // The resolver thread's verdict on this thread's touch (userfaultfd path).
      dead = g_death_sig.load(std::memory_order_acquire);
      if (dead > 0) die_of(k, dead, "page touch");
      errno = saved;
      chain_segv(sig, si, uc);
      return;
    }
    {
      std::lock_guard<std::mutex> l(g_map_mu);
      if (Map* m = find_map(addr)) {
        uintptr_t end = 0;
        if (!m->uffd) {
          dead = handle_fault(k, *m, addr, true, &end);
        } else {
          // A registered mapping traps only what its real protection refuses (a write to a
          // read-only mapping): the Kernel's answer to that touch, or SIGSEGV as in the field.
          const auto p = reinterpret_cast<void*>(align_down(addr, g_page));
          umbp_sim_result r = k->ops->touch(k->self, p, g_page, g_page);
          dead = r.signal ? r.signal : SIGSEGV;
        }
      }
    }
    if (dead == 0) {
      errno = saved;
      return;
    }
    if (dead > 0) die_of(k, dead, "page touch");
  }
  errno = saved;
  chain_segv(sig, si, uc);
}

void install_handler() {
  if (g_handler_installed) return;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGSEGV, &sa, &g_old_segv) == 0) g_handler_installed = true;
}

// The resolver thread: one missing-page fault of a registered mapping (userfaultfd path).
void resolve(const umbp_sim_kernel* k, uintptr_t addr, bool write) {
  const uintptr_t p = align_down(addr, g_page);
  int dead = -1;
  uintptr_t end = 0;
  {
    std::lock_guard<std::mutex> l(g_map_mu);
    Map* m = find_map(addr);
    if (k && m && m->uffd) dead = handle_fault(k, *m, addr, write, &end);
  }
  if (dead == 0) {
    uffd_wake(p, end - p);
    return;
  }
  // Dead (or not a simulated mapping any more): the faulting thread itself must die, in its
  // SIGSEGV handler (die_of: the report, then the signal; or the handler before ours). Its
  // retried access finds the page PROT_NONE.
  g_death_sig.store(dead > 0 ? dead : 0, std::memory_order_release);
  g_death_page.store(p, std::memory_order_release);
  sys_mprotect(reinterpret_cast<void*>(p), g_page, PROT_NONE);
  uffd_wake(p, g_page);
}

void* resolver_main(void*) {
  pollfd fds[2] = {{g_uffd, POLLIN, 0}, {g_stop_fd, POLLIN, 0}};
  uffd_msg msgs[16];
  for (;;) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[1].revents) break;
    const ssize_t n = ::read(g_uffd, msgs, sizeof msgs);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      break;
    }
    const umbp_sim_kernel* k = g_kernel.load(std::memory_order_acquire);
    for (size_t i = 0; i < static_cast<size_t>(n) / sizeof(uffd_msg); ++i) {
      if (msgs[i].event != UFFD_EVENT_PAGEFAULT) continue;
      const auto& pf = msgs[i].arg.pagefault;
      resolve(k, static_cast<uintptr_t>(pf.address), (pf.flags & UFFD_PAGEFAULT_FLAG_WRITE) != 0);
    }
  }
  return nullptr;
}

// The userfaultfd path set up (fd, zero source, resolver thread), or false with why.
bool start_uffd(char* why, size_t cap) {
  g_uffd = open_uffd(why, cap);
  if (g_uffd < 0) return false;
  g_zero_src = sys_mmap(nullptr, kCopyChunk, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  g_stop_fd = static_cast<int>(raw(SYS_eventfd2, 0, EFD_CLOEXEC));
  int err = (g_zero_src == MAP_FAILED || g_stop_fd < 0) ? errno : 0;
  if (!err) {
    // The resolver takes no signals: they go to the threads that run Python and the allocator.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    err = pthread_create(&g_resolver, nullptr, resolver_main, nullptr);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
  }
  if (err) {
    snprintf(why, cap, "resolver thread: %s", strerror(err));
    if (g_zero_src != MAP_FAILED) raw(SYS_munmap, L(g_zero_src), static_cast<long>(kCopyChunk));
    if (g_stop_fd >= 0) sys_close(g_stop_fd);
    sys_close(g_uffd);
    g_zero_src = nullptr;
    g_uffd = g_stop_fd = -1;
    return false;
  }
  g_resolver_running = true;
  return true;
}

void stop_uffd() {
  if (g_resolver_running) {
    const uint64_t one = 1;
    if (::write(g_stop_fd, &one, sizeof one) == sizeof one) pthread_join(g_resolver, nullptr);
    g_resolver_running = false;
  }
  if (g_zero_src) raw(SYS_munmap, L(g_zero_src), static_cast<long>(kCopyChunk));
  if (g_stop_fd >= 0) sys_close(g_stop_fd);
  if (g_uffd >= 0) sys_close(g_uffd);  // registrations end with it
  g_zero_src = nullptr;
  g_uffd = g_stop_fd = -1;
}

// fork(): a child has no resolver thread, and its copies of registered mappings are not
// registered (no UFFD_FEATURE_EVENT_FORK): a missing page would be plain zeroed memory, outside
// the simulation. The child's simulated mappings move to the SIGSEGV path instead (PROT_NONE
// but the granted runs, whose pages it inherited), and it drops the parent's userfaultfd (its
// ioctls would act on the parent's address space). The tables are locked across the fork.
void fork_prepare() {
  g_fd_mu.lock();
  g_map_mu.lock();
}
void fork_parent() {
  g_map_mu.unlock();
  g_fd_mu.unlock();
}
void fork_child() {
  if (g_path.load() == UMBP_SIM_FAULT_PATH_UFFD) {
    for (int i = 0; i < g_nmaps; ++i) {
      Map& m = g_maps[i];
      if (!m.uffd) continue;
      sys_mprotect(reinterpret_cast<void*>(m.start), m.end - m.start, PROT_NONE);
      m.uffd = false;
    }
    for (int i = 0; i < g_ngrants; ++i) {
      const Grant& g = g_grants[i];
      if (const Map* m = find_map(g.start))
        sys_mprotect(reinterpret_cast<void*>(g.start), g.end - g.start,
                     m->prot & (PROT_READ | PROT_WRITE | PROT_EXEC));
    }
    if (g_uffd >= 0) sys_close(g_uffd);  // our reference only: the parent's stays registered
    if (g_stop_fd >= 0) sys_close(g_stop_fd);
    if (g_zero_src) raw(SYS_munmap, L(g_zero_src), static_cast<long>(kCopyChunk));
    g_uffd = g_stop_fd = -1;
    g_zero_src = nullptr;
    g_resolver_running = false;
    g_death_page.store(0);
    g_death_sig.store(0);
    g_path.store(UMBP_SIM_FAULT_PATH_SIGSEGV);
  }
  g_map_mu.unlock();
  g_fd_mu.unlock();
}

// Trap touches of [start, end), a new simulated mapping with protection `prot`: register it
// (userfaultfd path, at its real protection) or make it PROT_NONE. Returns whether registered.
bool trap(uintptr_t start, uintptr_t end, int prot) {
  if (g_path.load(std::memory_order_relaxed) == UMBP_SIM_FAULT_PATH_UFFD) {
    sys_mprotect(reinterpret_cast<void*>(start), end - start,
                 prot & (PROT_READ | PROT_WRITE | PROT_EXEC));
    if (uffd_register(start, end - start)) return true;
  }
  sys_mprotect(reinterpret_cast<void*>(start), end - start, PROT_NONE);
  return false;
}

// ---- the routed calls --------------------------------------------------------------------

void* do_mmap(const umbp_sim_kernel* k, void* addr, size_t len, int prot, int flags, int fd,
              off_t off) {
  umbp_sim_result r = k->ops->mmap(k->self, addr, len, prot, flags, fd, static_cast<long>(off));
  if (r.signal) die_of(k, r.signal, "mmap");
  if (r.error) {
    errno = r.error;
    return MAP_FAILED;
  }
  const auto start = static_cast<uintptr_t>(r.value);
  if (g_simulated) {
    uintptr_t end = k->ops->mapping_end(k->self, reinterpret_cast<void*>(start));
    if (end <= start) end = start + align_up(len, g_page);
    std::lock_guard<std::mutex> l(g_map_mu);
    forget_range(start, end);  // MAP_FIXED over an older simulated mapping
    const bool registered = trap(start, end, prot);
    // Big grants (32 MiB blocks) move as transparent hugepages; small mappings get none. A
    // registered range gets none either: a write fault there would allocate and zero a 2 MiB
    // page before handing the fault to the resolver (and free it), the uffd path's whole cost.
    if (end - start >= kBig)
      raw_madvise(start, end - start, registered ? MADV_NOHUGEPAGE : MADV_HUGEPAGE);
    add_map(start, end, prot, registered);
  }
  return reinterpret_cast<void*>(start);
}

int do_munmap(const umbp_sim_kernel* k, void* addr, size_t len) {
  const auto lo = reinterpret_cast<uintptr_t>(addr);
  const uintptr_t hi = lo + align_up(len, g_page);
  struct Piece {
    uintptr_t lo, hi;
    int prot;
  };
  Piece pieces[64];
  int npieces = 0;
  if (g_simulated && hi > lo) {
    std::lock_guard<std::mutex> l(g_map_mu);
    // Before the Kernel unmaps (or keeps for reuse) the real range, make it plain memory again.
    for (int i = 0; i < g_nmaps && npieces < 64; ++i) {
      const Map& m = g_maps[i];
      const uintptr_t a = std::max(lo, m.start), b = std::min(hi, m.end);
      if (a < b) pieces[npieces++] = Piece{a, b, m.prot};
    }
    for (int i = 0; i < npieces; ++i) {
      forget_range(pieces[i].lo, pieces[i].hi);
      sys_mmap(reinterpret_cast<void*>(pieces[i].lo), pieces[i].hi - pieces[i].lo,
               PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
               0);
    }
  }
  umbp_sim_result r = k->ops->munmap(k->self, addr, len);
  if (!r.signal && r.error && npieces) {
    // Still mapped in the Kernel: trap its pages again (their contents are gone).
    std::lock_guard<std::mutex> l(g_map_mu);
    for (int i = 0; i < npieces; ++i)
      add_map(pieces[i].lo, pieces[i].hi, pieces[i].prot,
              trap(pieces[i].lo, pieces[i].hi, pieces[i].prot));
  }
  return r.error || r.signal ? fail(k, r, "munmap") : 0;
}

// The nodemask goes to the Kernel as the allocator passed it: umbp-sim's kernels read it as
// copy_from_user does, in Linux's order of checks (a maxnode above PAGE_SIZE*8 is EINVAL unread,
// a mask that cannot be read EFAULT: kernel/user_memory.h), never with a SIGSEGV of this process.
long do_mbind(const umbp_sim_kernel* k, void* addr, unsigned long len, int mode,
              const unsigned long* mask, unsigned long maxnode, unsigned flags) {
  umbp_sim_result r = k->ops->mbind(k->self, addr, len, mode, mask, maxnode, flags);
  return r.error || r.signal ? fail(k, r, "mbind") : 0;
}

int do_memfd(const umbp_sim_kernel* k, const char* name, unsigned flags) {
  umbp_sim_result r = k->ops->memfd_create(k->self, name, flags);
  if (r.error || r.signal) return fail(k, r, "memfd_create");
  add_sim_fd(static_cast<int>(r.value));
  return static_cast<int>(r.value);
}

int do_ftruncate(const umbp_sim_kernel* k, int fd, off_t len) {
  umbp_sim_result r = k->ops->ftruncate(k->self, fd, static_cast<long>(len));
  return r.error || r.signal ? fail(k, r, "ftruncate") : 0;
}

int do_close(const umbp_sim_kernel* k, int fd) {
  umbp_sim_result r = k->ops->close(k->self, fd);
  if (!r.error && !r.signal) drop_sim_fd(fd);
  return r.error || r.signal ? fail(k, r, "close") : 0;
}

int do_madvise(const umbp_sim_kernel* k, void* addr, size_t len, int advice) {
  umbp_sim_result r = k->ops->madvise(k->self, addr, len, advice);
  return r.error || r.signal ? fail(k, r, "madvise") : 0;
}

bool proc_or_sys(const char* path) {
  return path && (strncmp(path, "/proc/", 6) == 0 || strncmp(path, "/sys/", 5) == 0);
}

// A real, readable fd holding the Kernel's rendering of `path` (or -1 with its errno).
int open_rendered(const umbp_sim_kernel* k, const char* path) {
  char* data = nullptr;
  umbp_sim_result r = k->ops->read_file(k->self, path, &data);
  if (r.error || r.signal) return fail(k, r, "open");
  int fd = static_cast<int>(raw(SYS_memfd_create, L("umbp-sim-file"), MFD_CLOEXEC));
  if (fd < 0) {
    free(data);
    return -1;
  }
  size_t left = static_cast<size_t>(r.value);
  const char* p = data;
  while (left > 0) {
    ssize_t w = ::write(fd, p, left);
    if (w <= 0) break;
    p += w;
    left -= static_cast<size_t>(w);
  }
  free(data);
  ::lseek(fd, 0, SEEK_SET);
  g_routed.fetch_add(1, std::memory_order_relaxed);
  return fd;
}

// Opens of /proc and /sys count for the thread inside enter()/leave(), whoever calls.
const umbp_sim_kernel* route_open(bool wrapped, const char* path) {
  if (!proc_or_sys(path)) return nullptr;
  const umbp_sim_kernel* k = g_kernel.load(std::memory_order_acquire);
  (void)wrapped;
  return (k && t_scope > 0) ? k : nullptr;
}

FILE* fopen_rendered(const umbp_sim_kernel* k, const char* path, const char* mode) {
  int fd = open_rendered(k, path);
  if (fd < 0) return nullptr;
  FILE* f = fdopen(fd, mode && mode[0] ? mode : "r");
  if (!f) sys_close(fd);
  return f;
}

int open_mode_arg(int flags, va_list ap) {
  return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? va_arg(ap, int) : 0;
}

}  // namespace

// ---- control API -------------------------------------------------------------------------

extern "C" {

int umbp_sim_interposer_version(void) { return UMBP_SIM_INTERPOSER_VERSION; }

int umbp_sim_interposer_activate(const umbp_sim_kernel* kernel) {
  if (!kernel || !kernel->ops || kernel->ops->abi_version != UMBP_SIM_KERNEL_ABI_VERSION)
    return EINVAL;
  umbp_sim_interposer_deactivate();
  static pthread_once_t fork_handlers = PTHREAD_ONCE_INIT;
  pthread_once(&fork_handlers, [] { pthread_atfork(fork_prepare, fork_parent, fork_child); });
  kernel->ops->retain(kernel->self);
  g_kernel_copy = *kernel;
  g_page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  g_simulated = (kernel->ops->flags & UMBP_SIM_KERNEL_SIMULATED) != 0;
  find_forwarders();
  g_death_page.store(0);
  g_death_sig.store(0);
  if (g_simulated) {
    int path = UMBP_SIM_FAULT_PATH_SIGSEGV;
    if (g_want_path != UMBP_SIM_FAULT_PATH_SIGSEGV) {
      if (start_uffd(g_uffd_why, sizeof g_uffd_why)) {
        path = UMBP_SIM_FAULT_PATH_UFFD;
      } else if (g_want_path == UMBP_SIM_FAULT_PATH_UFFD) {
        kernel->ops->release(kernel->self);
        return EOPNOTSUPP;
      }
    }
    g_path.store(path);
    install_handler();  // both paths: a simulated death is reported in the faulting thread
  }
  g_kernel.store(&g_kernel_copy, std::memory_order_release);
  return 0;
}

int umbp_sim_interposer_set_fault_path(int path) {
  if (path < UMBP_SIM_FAULT_PATH_AUTO || path > UMBP_SIM_FAULT_PATH_UFFD) return EINVAL;
  g_want_path = path;
  return 0;
}

int umbp_sim_interposer_fault_path(void) { return g_path.load(); }

size_t umbp_sim_interposer_uffd_unavailable(char* buf, size_t cap) {
  char why[sizeof g_uffd_why] = "";
  const int fd = open_uffd(why, sizeof why);
  if (fd >= 0) {
    sys_close(fd);
    why[0] = '\0';
  }
  if (cap > 0) snprintf(buf, cap, "%s", why);
  return strlen(why);
}

void umbp_sim_interposer_deactivate(void) {
  const umbp_sim_kernel* k = g_kernel.exchange(nullptr);
  stop_uffd();
  g_path.store(UMBP_SIM_FAULT_PATH_NONE);
  if (g_handler_installed) {
    sigaction(SIGSEGV, &g_old_segv, nullptr);
    g_handler_installed = false;
  }
  if (k) k->ops->release(k->self);
}

int umbp_sim_interposer_add_caller_object(const char* path) {
  return collect_ranges([path](dl_phdr_info* info) { return strcmp(info->dlpi_name, path) == 0; },
                        g_callers, &g_ncallers);
}

void umbp_sim_interposer_enter(void) { ++t_scope; }
void umbp_sim_interposer_leave(void) {
  if (t_scope > 0) --t_scope;
}

void umbp_sim_interposer_set_resident_limit(size_t bytes) {
  std::lock_guard<std::mutex> l(g_map_mu);
  g_resident_limit = std::max<size_t>(bytes, size_t{8} << 20);
}

void umbp_sim_interposer_get_stats(umbp_sim_interposer_stats* out) {
  std::lock_guard<std::mutex> l(g_map_mu);
  out->routed = g_routed.load();
  out->faults = g_faults.load();
  out->moved = g_moved.load();
  out->resident = g_res_big + g_res_small;
  out->mappings = static_cast<unsigned long>(g_nmaps);
  out->sim_fds = static_cast<unsigned long>(g_nfds.load());
}

}  // extern "C"

// ---- the interposed functions (LD_PRELOAD names and -Wl,--wrap names) --------------------

#define UMBP_RET __builtin_return_address(0)

namespace {

void* mmap_impl(bool w, void* ret, void* a, size_t n, int prot, int flags, int fd, off_t off) {
  const umbp_sim_kernel* k = (fd >= 0) ? kernel_for_fd(fd) : nullptr;
  if (!k && fd < 0) k = route(w, ret);
  if (k) return do_mmap(k, a, n, prot, flags, fd, off);
  static mmap_fn f = real<mmap_fn>("mmap");
  return f(a, n, prot, flags, fd, off);
}
int munmap_impl(bool w, void* ret, void* a, size_t n) {
  if (const umbp_sim_kernel* k = route(w, ret)) return do_munmap(k, a, n);
  static munmap_fn f = real<munmap_fn>("munmap");
  return f(a, n);
}
int madvise_impl(bool w, void* ret, void* a, size_t n, int adv) {
  if (const umbp_sim_kernel* k = route(w, ret)) return do_madvise(k, a, n, adv);
  static madvise_fn f = real<madvise_fn>("madvise");
  return f(a, n, adv);
}
long mbind_impl(bool w, void* ret, void* a, unsigned long n, int mode, const unsigned long* mask,
                unsigned long maxnode, unsigned flags) {
  if (const umbp_sim_kernel* k = route(w, ret))
    return do_mbind(k, a, n, mode, mask, maxnode, flags);
  static mbind_fn f = real<mbind_fn>("mbind");
  if (!f)
    return raw(SYS_mbind, L(a), static_cast<long>(n), mode, L(mask), static_cast<long>(maxnode),
               flags);
  return f(a, n, mode, mask, maxnode, flags);
}
int memfd_impl(bool w, void* ret, const char* name, unsigned flags) {
  if (const umbp_sim_kernel* k = route(w, ret)) return do_memfd(k, name, flags);
  static memfd_fn f = real<memfd_fn>("memfd_create");
  return f(name, flags);
}
int ftruncate_impl(int fd, off_t n) {
  if (const umbp_sim_kernel* k = kernel_for_fd(fd)) return do_ftruncate(k, fd, n);
  static ftruncate_fn f = real<ftruncate_fn>("ftruncate");
  return f(fd, n);
}
int close_impl(int fd) {
  if (const umbp_sim_kernel* k = kernel_for_fd(fd)) return do_close(k, fd);
  static close_fn f = real<close_fn>("close");
  return f(fd);
}
long sysconf_impl(bool w, void* ret, int name) {
  if (name == _SC_PAGESIZE) {
    if (const umbp_sim_kernel* k = route(w, ret))
      return static_cast<long>(k->ops->page_size(k->self));
  }
  static sysconf_fn f = real<sysconf_fn>("sysconf");
  return f(name);
}
long syscall_impl(bool w, void* ret, long nr, long a1, long a2, long a3, long a4, long a5,
                  long a6) {
  if (nr == SYS_mbind || nr == SYS_memfd_create) {
    if (const umbp_sim_kernel* k = route(w, ret)) {
      if (nr == SYS_mbind)
        return do_mbind(k, reinterpret_cast<void*>(a1), static_cast<unsigned long>(a2),
                        static_cast<int>(a3), reinterpret_cast<const unsigned long*>(a4),
                        static_cast<unsigned long>(a5), static_cast<unsigned>(a6));
      return do_memfd(k, reinterpret_cast<const char*>(a1), static_cast<unsigned>(a2));
    }
  }
  if (nr == SYS_close || nr == SYS_ftruncate) {
    const int fd = static_cast<int>(a1);
    if (const umbp_sim_kernel* k = kernel_for_fd(fd))
      return nr == SYS_close ? do_close(k, fd) : do_ftruncate(k, fd, static_cast<off_t>(a2));
  }
  static syscall_fn f = real<syscall_fn>("syscall");
  return f(nr, a1, a2, a3, a4, a5, a6);
}
int open_impl(bool w, const char* path, int flags, int mode, std::atomic<void*>* cache,
              const char* real_name) {
  if (const umbp_sim_kernel* k = route_open(w, path)) return open_rendered(k, path);
  auto f = cached<open_fn>(cache, real_name);
  return f(path, flags, mode);
}
int openat_impl(bool w, int dirfd, const char* path, int flags, int mode, std::atomic<void*>* cache,
                const char* real_name) {
  if (path && path[0] == '/') {
    if (const umbp_sim_kernel* k = route_open(w, path)) return open_rendered(k, path);
  }
  auto f = cached<openat_fn>(cache, real_name);
  return f(dirfd, path, flags, mode);
}
FILE* fopen_impl(bool w, const char* path, const char* mode, std::atomic<void*>* cache,
                 const char* real_name) {
  if (const umbp_sim_kernel* k = route_open(w, path)) return fopen_rendered(k, path, mode);
  auto f = cached<fopen_fn>(cache, real_name);
  return f(path, mode);
}

}  // namespace

#define UMBP_EXPORT extern "C" __attribute__((visibility("default")))

#define UMBP_DEFINE_BOTH(ret_t, name, params, wrapped_call, preload_call) \
  UMBP_EXPORT ret_t name params { return preload_call; }                  \
  UMBP_EXPORT ret_t __wrap_##name params { return wrapped_call; }

UMBP_DEFINE_BOTH(void*, mmap, (void* a, size_t n, int p, int f, int fd, off_t o),
                 mmap_impl(true, nullptr, a, n, p, f, fd, o),
                 mmap_impl(false, UMBP_RET, a, n, p, f, fd, o))
UMBP_DEFINE_BOTH(void*, mmap64, (void* a, size_t n, int p, int f, int fd, off_t o),
                 mmap_impl(true, nullptr, a, n, p, f, fd, o),
                 mmap_impl(false, UMBP_RET, a, n, p, f, fd, o))
UMBP_DEFINE_BOTH(int, munmap, (void* a, size_t n), munmap_impl(true, nullptr, a, n),
                 munmap_impl(false, UMBP_RET, a, n))
UMBP_DEFINE_BOTH(int, madvise, (void* a, size_t n, int adv), madvise_impl(true, nullptr, a, n, adv),
                 madvise_impl(false, UMBP_RET, a, n, adv))
UMBP_DEFINE_BOTH(long, mbind,
                 (void* a, unsigned long n, int m, const unsigned long* mask, unsigned long mx,
                  unsigned fl),
                 mbind_impl(true, nullptr, a, n, m, mask, mx, fl),
                 mbind_impl(false, UMBP_RET, a, n, m, mask, mx, fl))
UMBP_DEFINE_BOTH(int, memfd_create, (const char* name, unsigned fl),
                 memfd_impl(true, nullptr, name, fl), memfd_impl(false, UMBP_RET, name, fl))
UMBP_DEFINE_BOTH(int, ftruncate, (int fd, off_t n), ftruncate_impl(fd, n), ftruncate_impl(fd, n))
UMBP_DEFINE_BOTH(int, ftruncate64, (int fd, off_t n), ftruncate_impl(fd, n), ftruncate_impl(fd, n))
UMBP_DEFINE_BOTH(int, close, (int fd), close_impl(fd), close_impl(fd))
UMBP_DEFINE_BOTH(long, sysconf, (int name), sysconf_impl(true, nullptr, name),
                 sysconf_impl(false, UMBP_RET, name))
namespace {
std::atomic<void*> c_fopen{nullptr}, c_fopen64{nullptr}, c_open2{nullptr}, c_open64_2{nullptr},
    c_openat2{nullptr}, c_open{nullptr}, c_open64{nullptr}, c_openat{nullptr}, c_openat64{nullptr};
}  // namespace

UMBP_DEFINE_BOTH(FILE*, fopen, (const char* p, const char* m),
                 fopen_impl(true, p, m, &c_fopen, "fopen"),
                 fopen_impl(false, p, m, &c_fopen, "fopen"))
UMBP_DEFINE_BOTH(FILE*, fopen64, (const char* p, const char* m),
                 fopen_impl(true, p, m, &c_fopen64, "fopen64"),
                 fopen_impl(false, p, m, &c_fopen64, "fopen64"))
UMBP_DEFINE_BOTH(int, __open_2, (const char* p, int fl),
                 open_impl(true, p, fl, 0, &c_open2, "__open_2"),
                 open_impl(false, p, fl, 0, &c_open2, "__open_2"))
UMBP_DEFINE_BOTH(int, __open64_2, (const char* p, int fl),
                 open_impl(true, p, fl, 0, &c_open64_2, "__open64_2"),
                 open_impl(false, p, fl, 0, &c_open64_2, "__open64_2"))
UMBP_DEFINE_BOTH(int, __openat_2, (int d, const char* p, int fl),
                 openat_impl(true, d, p, fl, 0, &c_openat2, "__openat_2"),
                 openat_impl(false, d, p, fl, 0, &c_openat2, "__openat_2"))

#define UMBP_DEFINE_VARIADIC_SYSCALL(name, wrapped)                                              \
  UMBP_EXPORT long name(long nr, ...) {                                                          \
    va_list ap;                                                                                  \
    va_start(ap, nr);                                                                            \
    long a[6];                                                                                   \
    for (long& x : a) x = va_arg(ap, long);                                                      \
    va_end(ap);                                                                                  \
    return syscall_impl(wrapped, wrapped ? nullptr : UMBP_RET, nr, a[0], a[1], a[2], a[3], a[4], \
                        a[5]);                                                                   \
  }
UMBP_DEFINE_VARIADIC_SYSCALL(syscall, false)
UMBP_DEFINE_VARIADIC_SYSCALL(__wrap_syscall, true)

#define UMBP_DEFINE_OPEN(name, wrapped, cache, real_name)      \
  UMBP_EXPORT int name(const char* p, int fl, ...) {           \
    va_list ap;                                                \
    va_start(ap, fl);                                          \
    const int mode = open_mode_arg(fl, ap);                    \
    va_end(ap);                                                \
    return open_impl(wrapped, p, fl, mode, &cache, real_name); \
  }
UMBP_DEFINE_OPEN(open, false, c_open, "open")
UMBP_DEFINE_OPEN(open64, false, c_open64, "open64")
UMBP_DEFINE_OPEN(__wrap_open, true, c_open, "open")
UMBP_DEFINE_OPEN(__wrap_open64, true, c_open64, "open64")

#define UMBP_DEFINE_OPENAT(name, wrapped, cache, real_name)         \
  UMBP_EXPORT int name(int d, const char* p, int fl, ...) {         \
    va_list ap;                                                     \
    va_start(ap, fl);                                               \
    const int mode = open_mode_arg(fl, ap);                         \
    va_end(ap);                                                     \
    return openat_impl(wrapped, d, p, fl, mode, &cache, real_name); \
  }
UMBP_DEFINE_OPENAT(openat, false, c_openat, "openat")
UMBP_DEFINE_OPENAT(openat64, false, c_openat64, "openat64")
UMBP_DEFINE_OPENAT(__wrap_openat, true, c_openat, "openat")
UMBP_DEFINE_OPENAT(__wrap_openat64, true, c_openat64, "openat64")
