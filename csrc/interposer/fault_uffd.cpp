// The userfaultfd fault path: simulated mappings stay at their real protection, registered for
// missing-page faults; a resolver thread asks the Kernel and fills the run (UFFDIO_COPY for a
// write, UFFDIO_ZEROPAGE for a read) or moves an old block there, exactly the grants of the
// SIGSEGV path. The SIGSEGV handler stays installed: a simulated death is handed to the faulting
// thread through it. And fork(): a child moves to the SIGSEGV path.
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>

#include <algorithm>

#include "interposer/interposer_internal.h"

#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1  // Linux 5.11: handle user-mode faults only (no privilege needed)
#endif
#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC_NEW _IO(0xAA, 0x00)  // Linux 6.1: /dev/userfaultfd
#endif

namespace umbp_interpose {

int g_want_path = UMBP_SIM_FAULT_PATH_AUTO;
std::atomic<int> g_path{UMBP_SIM_FAULT_PATH_NONE};
char g_uffd_why[256];
std::atomic<uintptr_t> g_death_page{0};
std::atomic<int> g_death_sig{0};

namespace {
int g_uffd = -1;
int g_stop_fd = -1;  // eventfd: the resolver thread's stop signal
pthread_t g_resolver;
bool g_resolver_running = false;
void* g_zero_src = nullptr;  // kCopyChunk bytes of never-written (zero-page) memory
constexpr size_t kCopyChunk = size_t{2} << 20;

void uffd_wake(uintptr_t start, size_t len) {
  uffdio_range r{start, len};
  sys_ioctl(g_uffd, UFFDIO_WAKE, &r);
}
}  // namespace

bool uffd_register(uintptr_t start, size_t len) {
  uffdio_register r;
  memset(&r, 0, sizeof r);
  r.range.start = start;
  r.range.len = len;
  r.mode = UFFDIO_REGISTER_MODE_MISSING;
  return sys_ioctl(g_uffd, UFFDIO_REGISTER, &r) == 0;
}

bool uffd_unregister(uintptr_t start, size_t len) {
  uffdio_range r{start, len};
  return sys_ioctl(g_uffd, UFFDIO_UNREGISTER, &r) == 0;
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

namespace {

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

}  // namespace

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
    if (g_zero_src != MAP_FAILED) sys_munmap(g_zero_src, kCopyChunk);
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
  if (g_zero_src) sys_munmap(g_zero_src, kCopyChunk);
  if (g_stop_fd >= 0) sys_close(g_stop_fd);
  if (g_uffd >= 0) sys_close(g_uffd);  // registrations end with it
  g_zero_src = nullptr;
  g_uffd = g_stop_fd = -1;
}

// fork(): a child has no resolver thread, and its copies of registered mappings are not
// registered (no UFFD_FEATURE_EVENT_FORK): a missing page would be plain zeroed memory, outside
// the simulation. The child's simulated mappings move to the SIGSEGV path instead (PROT_NONE
// but the granted runs, whose pages it inherited), and it drops the parent's userfaultfd (its
// ioctls would act on the parent's address space). The tables are locked across the fork. The
// evidence fd is the run's, not the child's: a death in the child hands nothing to umbp-sim.
namespace {
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
    if (g_zero_src) sys_munmap(g_zero_src, kCopyChunk);
    g_uffd = g_stop_fd = -1;
    g_zero_src = nullptr;
    g_resolver_running = false;
    g_death_page.store(0);
    g_death_sig.store(0);
    g_path.store(UMBP_SIM_FAULT_PATH_SIGSEGV);
  }
  forget_evidence_fd_in_fork_child();
  g_map_mu.unlock();
  g_fd_mu.unlock();
}
}  // namespace

void register_fork_handlers() {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, [] { pthread_atfork(fork_prepare, fork_parent, fork_child); });
}

}  // namespace umbp_interpose
