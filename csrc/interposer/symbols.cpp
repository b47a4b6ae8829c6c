// The interposed functions, under their LD_PRELOAD names and their -Wl,--wrap names: each asks
// routing.cpp whose call it is and goes to the Kernel (calls.cpp) or to the real function.
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>

#include "interposer/interposer_internal.h"

namespace umbp_interpose {
namespace {

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
  return reinterpret_cast<F>(next_symbol(name));
}

// The real function `name`, looked up once into *cache.
template <typename F>
F cached(std::atomic<void*>* cache, const char* name) {
  void* f = cache->load(std::memory_order_relaxed);
  if (!f) {
    f = next_symbol(name);
    cache->store(f, std::memory_order_relaxed);
  }
  return reinterpret_cast<F>(f);
}

int open_mode_arg(int flags, va_list ap) {
  return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? va_arg(ap, int) : 0;
}

void* mmap_impl(bool w, void* ret, void* a, size_t n, int prot, int flags, int fd, off_t off) {
  const umbp_sim_kernel* k = (fd >= 0) ? kernel_for_fd(fd) : nullptr;
  if (!k && fd < 0) k = route(w, ret);
  if (k) {
    note_site(k, ret);
    return do_mmap(k, a, n, prot, flags, fd, off);
  }
  static mmap_fn f = real<mmap_fn>("mmap");
  return f(a, n, prot, flags, fd, off);
}
int munmap_impl(bool w, void* ret, void* a, size_t n) {
  if (const umbp_sim_kernel* k = route_range(w, ret, a, n)) {
    note_site(k, ret);
    return do_munmap(k, a, n);
  }
  static munmap_fn f = real<munmap_fn>("munmap");
  return f(a, n);
}
int madvise_impl(bool w, void* ret, void* a, size_t n, int adv) {
  if (const umbp_sim_kernel* k = route_range(w, ret, a, n)) {
    note_site(k, ret);
    return do_madvise(k, a, n, adv);
  }
  static madvise_fn f = real<madvise_fn>("madvise");
  return f(a, n, adv);
}
long mbind_impl(bool w, void* ret, void* a, unsigned long n, int mode, const unsigned long* mask,
                unsigned long maxnode, unsigned flags) {
  if (const umbp_sim_kernel* k = route_range(w, ret, a, n)) {
    note_site(k, ret);
    return do_mbind(k, a, n, mode, mask, maxnode, flags);
  }
  static mbind_fn f = real<mbind_fn>("mbind");
  if (!f)
    return raw(SYS_mbind, L(a), static_cast<long>(n), mode, L(mask), static_cast<long>(maxnode),
               flags);
  return f(a, n, mode, mask, maxnode, flags);
}
int memfd_impl(bool w, void* ret, const char* name, unsigned flags) {
  if (const umbp_sim_kernel* k = route(w, ret)) {
    note_site(k, ret);
    return do_memfd(k, name, flags);
  }
  static memfd_fn f = real<memfd_fn>("memfd_create");
  return f(name, flags);
}
int ftruncate_impl(void* ret, int fd, off_t n) {
  if (const umbp_sim_kernel* k = kernel_for_fd(fd)) {
    note_site(k, ret);
    return do_ftruncate(k, fd, n);
  }
  static ftruncate_fn f = real<ftruncate_fn>("ftruncate");
  return f(fd, n);
}
int close_impl(void* ret, int fd) {
  if (const umbp_sim_kernel* k = kernel_for_fd(fd)) {
    note_site(k, ret);
    return do_close(k, fd);
  }
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
    const umbp_sim_kernel* k =
        nr == SYS_mbind ? route_range(w, ret, reinterpret_cast<void*>(a1), static_cast<size_t>(a2))
                        : route(w, ret);
    if (k) {
      note_site(k, ret);
      if (nr == SYS_mbind)
        return do_mbind(k, reinterpret_cast<void*>(a1), static_cast<unsigned long>(a2),
                        static_cast<int>(a3), reinterpret_cast<const unsigned long*>(a4),
                        static_cast<unsigned long>(a5), static_cast<unsigned>(a6));
      return do_memfd(k, reinterpret_cast<const char*>(a1), static_cast<unsigned>(a2));
    }
  }
  if (nr == SYS_move_pages) {
    if (const umbp_sim_kernel* k = route(w, ret)) {
      bool answered = false;
      const long r = do_move_pages(k, a1, static_cast<unsigned long>(a2),
                                   reinterpret_cast<void**>(a3), reinterpret_cast<const int*>(a4),
                                   reinterpret_cast<int*>(a5), static_cast<int>(a6), &answered);
      if (answered) return r;
    }
  }
  if (nr == SYS_close || nr == SYS_ftruncate) {
    const int fd = static_cast<int>(a1);
    if (const umbp_sim_kernel* k = kernel_for_fd(fd)) {
      note_site(k, ret);
      return nr == SYS_close ? do_close(k, fd) : do_ftruncate(k, fd, static_cast<off_t>(a2));
    }
  }
  static syscall_fn f = real<syscall_fn>("syscall");
  return f(nr, a1, a2, a3, a4, a5, a6);
}
// The simulated host's answer to opening `path`: true (with *fd) when the call is its.
bool try_sim_open(const char* path, int flags, int mode, int* fd) {
  const umbp_sim_kernel* k = route_open(path);
  if (!k) return false;
  bool answered = true;
  *fd = have_sim_root() ? open_sim_path(k, path, flags, mode, &answered) : open_rendered(k, path);
  return answered;
}
int open_impl(const char* path, int flags, int mode, std::atomic<void*>* cache,
              const char* real_name) {
  int fd = -1;
  if (try_sim_open(path, flags, mode, &fd)) return fd;
  auto f = cached<open_fn>(cache, real_name);
  return f(path, flags, mode);
}
int openat_impl(int dirfd, const char* path, int flags, int mode, std::atomic<void*>* cache,
                const char* real_name) {
  int fd = -1;
  if (path && path[0] == '/' && try_sim_open(path, flags, mode, &fd)) return fd;
  auto f = cached<openat_fn>(cache, real_name);
  return f(dirfd, path, flags, mode);
}
FILE* fopen_impl(const char* path, const char* mode, std::atomic<void*>* cache,
                 const char* real_name) {
  if (const umbp_sim_kernel* k = route_open(path)) {
    if (!have_sim_root()) return fopen_rendered(k, path, mode);
    bool answered = false;
    FILE* f = fopen_sim_path(k, path, mode, &answered);
    if (answered) return f;
  }
  auto f = cached<fopen_fn>(cache, real_name);
  return f(path, mode);
}
// A directory listing of the simulated host's /proc and /sys (exec mode only: the scope mode
// never listed directories).
DIR* opendir_impl(const char* path) {
  using opendir_fn = DIR* (*)(const char*);
  static opendir_fn f = real<opendir_fn>("opendir");
  if (have_sim_root() && route_open(path)) {
    bool answered = false;
    DIR* d = opendir_sim_path(path, f, &answered);
    if (answered) return d;
  }
  return f(path);
}

}  // namespace
}  // namespace umbp_interpose

using namespace umbp_interpose;

// The caller's return address: a preloaded name's routing asks whose object it is in; every
// name (the wrapped ones too, whose routing does not ask) gives it as the call's site.
#define UMBP_RET __builtin_return_address(0)
#define UMBP_EXPORT extern "C" __attribute__((visibility("default")))

#define UMBP_DEFINE_BOTH(ret_t, name, params, wrapped_call, preload_call) \
  UMBP_EXPORT ret_t name params { return preload_call; }                  \
  UMBP_EXPORT ret_t __wrap_##name params { return wrapped_call; }

UMBP_DEFINE_BOTH(void*, mmap, (void* a, size_t n, int p, int f, int fd, off_t o),
                 mmap_impl(true, UMBP_RET, a, n, p, f, fd, o),
                 mmap_impl(false, UMBP_RET, a, n, p, f, fd, o))
UMBP_DEFINE_BOTH(void*, mmap64, (void* a, size_t n, int p, int f, int fd, off_t o),
                 mmap_impl(true, UMBP_RET, a, n, p, f, fd, o),
                 mmap_impl(false, UMBP_RET, a, n, p, f, fd, o))
UMBP_DEFINE_BOTH(int, munmap, (void* a, size_t n), munmap_impl(true, UMBP_RET, a, n),
                 munmap_impl(false, UMBP_RET, a, n))
UMBP_DEFINE_BOTH(int, madvise, (void* a, size_t n, int adv),
                 madvise_impl(true, UMBP_RET, a, n, adv), madvise_impl(false, UMBP_RET, a, n, adv))
UMBP_DEFINE_BOTH(long, mbind,
                 (void* a, unsigned long n, int m, const unsigned long* mask, unsigned long mx,
                  unsigned fl),
                 mbind_impl(true, UMBP_RET, a, n, m, mask, mx, fl),
                 mbind_impl(false, UMBP_RET, a, n, m, mask, mx, fl))
UMBP_DEFINE_BOTH(int, memfd_create, (const char* name, unsigned fl),
                 memfd_impl(true, UMBP_RET, name, fl), memfd_impl(false, UMBP_RET, name, fl))
UMBP_DEFINE_BOTH(int, ftruncate, (int fd, off_t n), ftruncate_impl(UMBP_RET, fd, n),
                 ftruncate_impl(UMBP_RET, fd, n))
UMBP_DEFINE_BOTH(int, ftruncate64, (int fd, off_t n), ftruncate_impl(UMBP_RET, fd, n),
                 ftruncate_impl(UMBP_RET, fd, n))
UMBP_DEFINE_BOTH(int, close, (int fd), close_impl(UMBP_RET, fd), close_impl(UMBP_RET, fd))
// sysconf and sigaction are reached by ThreadSanitizer's runtime while it initializes
// (UMBP_NO_TSAN): any other name than _SC_PAGESIZE goes to the real function without entering an
// instrumented one (looked up with plain atomics).
namespace {
void* g_real_sysconf = nullptr;
UMBP_NO_TSAN long real_sysconf(int name) {
  void* f = __atomic_load_n(&g_real_sysconf, __ATOMIC_RELAXED);
  if (!f) {
    f = next_symbol("sysconf");
    __atomic_store_n(&g_real_sysconf, f, __ATOMIC_RELAXED);
  }
  return reinterpret_cast<long (*)(int)>(f)(name);
}
}  // namespace
UMBP_EXPORT UMBP_NO_TSAN long sysconf(int name) {
  return name == _SC_PAGESIZE ? sysconf_impl(false, UMBP_RET, name) : real_sysconf(name);
}
UMBP_EXPORT UMBP_NO_TSAN long __wrap_sysconf(int name) {
  return name == _SC_PAGESIZE ? sysconf_impl(true, nullptr, name) : real_sysconf(name);
}
namespace {
std::atomic<void*> c_fopen{nullptr}, c_fopen64{nullptr}, c_open2{nullptr}, c_open64_2{nullptr},
    c_openat2{nullptr}, c_open{nullptr}, c_open64{nullptr}, c_openat{nullptr}, c_openat64{nullptr};
}  // namespace

UMBP_EXPORT DIR* opendir(const char* p) { return opendir_impl(p); }

// A program's SIGSEGV handler (exec mode) goes behind the interposer's (fault_sigsegv.cpp).
UMBP_EXPORT UMBP_NO_TSAN int sigaction(int sig, const struct sigaction* act,
                                       struct sigaction* old) {
  if (program_sigaction(sig, act, old)) return 0;
  return real_sigaction(sig, act, old);
}
UMBP_EXPORT sighandler_t signal(int sig, sighandler_t handler) {
  struct sigaction sa, old;  // what glibc's signal() asks for: BSD semantics
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = handler;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaddset(&sa.sa_mask, sig);
  if (program_sigaction(sig, &sa, &old)) return old.sa_handler;
  using signal_fn = sighandler_t (*)(int, sighandler_t);
  static signal_fn f = real<signal_fn>("signal");
  return f(sig, handler);
}

// stat and access of the simulated host's /proc and /sys paths (exec mode only): what a
// program asks before it opens or lists (os.path.exists, std::filesystem::exists).
namespace {
template <typename F>
int stat_like(const char* path, const char* real_name, std::atomic<void*>* cache, F call) {
  if (have_sim_root() && path && route_open(path)) {
    char rendered[PATH_MAX];
    switch (sim_path_kind(path, rendered, sizeof rendered)) {
      case PathKind::File:
      case PathKind::Directory:
        return call(cached<void*>(cache, real_name), rendered);
      case PathKind::Missing:
        errno = ENOENT;
        return -1;
      case PathKind::Real:
        break;
    }
  }
  return call(cached<void*>(cache, real_name), path);
}
std::atomic<void*> c_stat{nullptr}, c_stat64{nullptr}, c_lstat{nullptr}, c_lstat64{nullptr},
    c_access{nullptr};
}  // namespace

#define UMBP_DEFINE_STAT(name, cache, st_t)                           \
  UMBP_EXPORT int name(const char* p, st_t* st) {                     \
    return stat_like(p, #name, &cache, [st](void* f, const char* q) { \
      return reinterpret_cast<int (*)(const char*, st_t*)>(f)(q, st); \
    });                                                               \
  }
UMBP_DEFINE_STAT(stat, c_stat, struct stat)
UMBP_DEFINE_STAT(stat64, c_stat64, struct stat64)
UMBP_DEFINE_STAT(lstat, c_lstat, struct stat)
UMBP_DEFINE_STAT(lstat64, c_lstat64, struct stat64)
UMBP_EXPORT int access(const char* p, int mode) {
  return stat_like(p, "access", &c_access, [mode](void* f, const char* q) {
    return reinterpret_cast<int (*)(const char*, int)>(f)(q, mode);
  });
}

UMBP_DEFINE_BOTH(FILE*, fopen, (const char* p, const char* m), fopen_impl(p, m, &c_fopen, "fopen"),
                 fopen_impl(p, m, &c_fopen, "fopen"))
UMBP_DEFINE_BOTH(FILE*, fopen64, (const char* p, const char* m),
                 fopen_impl(p, m, &c_fopen64, "fopen64"), fopen_impl(p, m, &c_fopen64, "fopen64"))
UMBP_DEFINE_BOTH(int, __open_2, (const char* p, int fl), open_impl(p, fl, 0, &c_open2, "__open_2"),
                 open_impl(p, fl, 0, &c_open2, "__open_2"))
UMBP_DEFINE_BOTH(int, __open64_2, (const char* p, int fl),
                 open_impl(p, fl, 0, &c_open64_2, "__open64_2"),
                 open_impl(p, fl, 0, &c_open64_2, "__open64_2"))
UMBP_DEFINE_BOTH(int, __openat_2, (int d, const char* p, int fl),
                 openat_impl(d, p, fl, 0, &c_openat2, "__openat_2"),
                 openat_impl(d, p, fl, 0, &c_openat2, "__openat_2"))

#define UMBP_DEFINE_VARIADIC_SYSCALL(name, wrapped)                                 \
  UMBP_EXPORT long name(long nr, ...) {                                             \
    va_list ap;                                                                     \
    va_start(ap, nr);                                                               \
    long a[6];                                                                      \
    for (long& x : a) x = va_arg(ap, long);                                         \
    va_end(ap);                                                                     \
    return syscall_impl(wrapped, UMBP_RET, nr, a[0], a[1], a[2], a[3], a[4], a[5]); \
  }
UMBP_DEFINE_VARIADIC_SYSCALL(syscall, false)
UMBP_DEFINE_VARIADIC_SYSCALL(__wrap_syscall, true)

#define UMBP_DEFINE_OPEN(name, cache, real_name)      \
  UMBP_EXPORT int name(const char* p, int fl, ...) {  \
    va_list ap;                                       \
    va_start(ap, fl);                                 \
    const int mode = open_mode_arg(fl, ap);           \
    va_end(ap);                                       \
    return open_impl(p, fl, mode, &cache, real_name); \
  }
UMBP_DEFINE_OPEN(open, c_open, "open")
UMBP_DEFINE_OPEN(open64, c_open64, "open64")
UMBP_DEFINE_OPEN(__wrap_open, c_open, "open")
UMBP_DEFINE_OPEN(__wrap_open64, c_open64, "open64")

#define UMBP_DEFINE_OPENAT(name, cache, real_name)          \
  UMBP_EXPORT int name(int d, const char* p, int fl, ...) { \
    va_list ap;                                             \
    va_start(ap, fl);                                       \
    const int mode = open_mode_arg(fl, ap);                 \
    va_end(ap);                                             \
    return openat_impl(d, p, fl, mode, &cache, real_name);  \
  }
UMBP_DEFINE_OPENAT(openat, c_openat, "openat")
UMBP_DEFINE_OPENAT(openat64, c_openat64, "openat64")
UMBP_DEFINE_OPENAT(__wrap_openat, c_openat, "openat")
UMBP_DEFINE_OPENAT(__wrap_openat64, c_openat64, "openat64")
