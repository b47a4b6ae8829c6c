// Whose call it is: the active Kernel, the allocator's objects (caller ranges, and the
// sanitizer runtimes that forward a call to us), the threads inside enter()/leave(), and the fds
// the Kernel created.
#include <dlfcn.h>
#include <execinfo.h>
#include <link.h>
#include <string.h>

#include "interposer/interposer_internal.h"

namespace umbp_interpose {

using syscall_fn = long (*)(long, ...);

// The definition of `name` after this library; the C library's when there is none after it (a
// library preloaded before this one, the C library itself, hides it from RTLD_NEXT: calling
// the null it returns was a SIGSEGV). Uninstrumented and with no static to guard: the TSan
// runtime's own start-up reaches it (through sigaction) before that runtime can run
// instrumented code. Its callers cache what it returns.
UMBP_NO_TSAN void* next_symbol(const char* name) {
  if (void* f = dlsym(RTLD_NEXT, name)) return f;
  void* libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);  // already loaded: no new load
  void* f = libc ? dlsym(libc, name) : nullptr;
  if (libc) dlclose(libc);  // NOLOAD took a reference
  return f;
}

long raw(long nr, long a1, long a2, long a3, long a4, long a5, long a6) {
  static syscall_fn f = reinterpret_cast<syscall_fn>(next_symbol("syscall"));
  return f(nr, a1, a2, a3, a4, a5, a6);
}

std::atomic<const umbp_sim_kernel*> g_kernel{nullptr};
std::atomic<bool> g_program{false};
umbp_sim_kernel g_kernel_copy;
bool g_simulated = false;
size_t g_page = 4096;

__thread int t_scope = 0;

namespace {
constexpr int kMaxRanges = 1024;  // objects of a big Python program: torch alone has dozens
struct Range {
  uintptr_t lo, hi;
};
Range g_callers[kMaxRanges];
std::atomic<int> g_ncallers{0};
}  // namespace

std::atomic<unsigned long> g_routed{0}, g_faults{0}, g_moved{0};

// Simulated fds (from the Kernel's memfd_create). Writers hold g_fd_mu; is_sim_fd reads without
// it: close() reaches it from anywhere, the Kernel's own real close() under its lock included
// (user_memory.cpp's pipe), and a Kernel lock is never held while taking g_fd_mu. An fd keeps
// its slot from add to drop (a dropped one leaves -1), so a reader never misses one by a move.
namespace {
constexpr int kMaxFds = 1024;
std::atomic<int> g_fds[kMaxFds];
std::atomic<int> g_fd_slots{0};  // slots ever used: readers scan these
}  // namespace
std::mutex g_fd_mu;
std::atomic<int> g_nfds{0};  // simulated fds open

bool is_sim_fd(int fd) {
  if (fd < 0) return false;
  const int n = g_fd_slots.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i)
    if (g_fds[i].load(std::memory_order_acquire) == fd) return true;
  return false;
}
void add_sim_fd(int fd) {
  std::lock_guard<std::mutex> l(g_fd_mu);
  const int n = g_fd_slots.load();
  int i = 0;
  while (i < n && g_fds[i].load() >= 0) ++i;
  if (i == kMaxFds) return;
  g_fds[i].store(fd, std::memory_order_release);
  if (i == n) g_fd_slots.store(n + 1, std::memory_order_release);
  g_nfds.fetch_add(1);
}
void drop_sim_fd(int fd) {
  std::lock_guard<std::mutex> l(g_fd_mu);
  for (int i = 0, n = g_fd_slots.load(); i < n; ++i)
    if (g_fds[i].load() == fd) {
      g_fds[i].store(-1, std::memory_order_release);
      g_nfds.fetch_sub(1);
      return;
    }
}

namespace {

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

// The program's objects (exec mode, program_caller): every object but those below, classified
// on its first call; ranges of the rest go here.
Range g_real[kMaxRanges];
std::atomic<int> g_nreal{0};
std::mutex g_classify_mu;
std::atomic<uintptr_t> g_python_fn{0};  // Py_IsInitialized: inside the Python interpreter

bool program_caller_at(uintptr_t r);

// Whether the call whose return address is `ret` is the allocator's: `is_caller` decides for an
// address; a call through a forwarder is decided by the first frame outside it and outside us.
template <typename IsCaller>
bool decide_caller(void* ret, IsCaller is_caller) {
  const auto r = reinterpret_cast<uintptr_t>(ret);
  const int nf = g_nforwarders.load(std::memory_order_acquire);
  if (nf == 0 || !in(g_forwarders, nf, r)) return is_caller(r);
  void* frames[16];
  const int depth = backtrace(frames, 16);
  for (int i = 0; i < depth; ++i) {
    const auto f = reinterpret_cast<uintptr_t>(frames[i]);
    if ((f >= g_self.lo && f < g_self.hi) || in(g_forwarders, nf, f)) continue;
    return is_caller(f);
  }
  return false;
}

bool caller_ok(void* ret) {
  return decide_caller(ret, [](uintptr_t r) {
    return in(g_callers, g_ncallers.load(std::memory_order_acquire), r);
  });
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

}  // namespace

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

namespace {
// The Kernel when the caller is the allocator's (uncounted). Takes no lock once the caller's
// object is classified: the Kernel's own real calls, made under its lock, come through here.
const umbp_sim_kernel* caller_kernel(bool wrapped, void* ret) {
  const umbp_sim_kernel* k = g_kernel.load(std::memory_order_acquire);
  if (!k) return nullptr;
  if (g_program.load(std::memory_order_relaxed)) {
    if (!wrapped && !decide_caller(ret, program_caller_at)) return nullptr;
  } else {
    if (t_scope <= 0) return nullptr;
    if (!wrapped && !caller_ok(ret)) return nullptr;
  }
  return k;
}
}  // namespace

// The Kernel when this call is the allocator's (wrapped: its object; preload: its caller).
const umbp_sim_kernel* route(bool wrapped, void* ret) {
  const umbp_sim_kernel* k = caller_kernel(wrapped, ret);
  if (k) g_routed.fetch_add(1, std::memory_order_relaxed);
  return k;
}

// Whose call first, then whose memory: the Kernel's own real munmap (reserve_real trimming an
// over-map, real_unmap), made while it holds its lock, is decided as the runtime's before the
// mapping table is asked, so it never waits for g_map_mu (the lock order: interposer_internal.h).
const umbp_sim_kernel* route_range(bool wrapped, void* ret, void* addr, size_t len) {
  const umbp_sim_kernel* k = caller_kernel(wrapped, ret);
  if (!k) return nullptr;
  if (g_program.load(std::memory_order_relaxed) && g_simulated) {
    const auto lo = reinterpret_cast<uintptr_t>(addr);
    if (!overlaps_sim_map(lo, lo + len)) return nullptr;
  }
  g_routed.fetch_add(1, std::memory_order_relaxed);
  return k;
}

const umbp_sim_kernel* kernel_for_fd(int fd) {
  const umbp_sim_kernel* k = g_kernel.load(std::memory_order_acquire);
  if (!k || !is_sim_fd(fd)) return nullptr;
  g_routed.fetch_add(1, std::memory_order_relaxed);
  return k;
}

namespace {

// The files a Kernel renders (SimKernel::render_locked's groups; LinuxKernel reads them from
// this box): an exact path, or a directory and everything under it.
constexpr const char* kKernelFiles[] = {"/proc/meminfo", "/proc/zoneinfo", "/proc/sys",
                                        "/sys/kernel/mm/hugepages", "/sys/devices/system/node"};

bool kernel_file(const char* path) {
  for (const char* f : kKernelFiles) {
    const size_t n = strlen(f);
    if (strncmp(path, f, n) == 0 && (path[n] == '\0' || path[n] == '/')) return true;
  }
  return false;
}

}  // namespace

// In an allocator's scope the Kernel answers the files it renders; any other /proc or /sys path
// (/proc/self/maps, /proc/cpuinfo) is this box's, as the real kernel would answer it, not a
// missing file. A program `umbp-sim exec` started has its host's whole tree (sim_paths.cpp).
const umbp_sim_kernel* route_open(const char* path) {
  if (!path || (strncmp(path, "/proc/", 6) != 0 && strncmp(path, "/sys/", 5) != 0)) return nullptr;
  const umbp_sim_kernel* k = g_kernel.load(std::memory_order_acquire);
  if (!k || !(t_scope > 0 || g_program.load(std::memory_order_relaxed))) return nullptr;
  return have_sim_root() || kernel_file(path) ? k : nullptr;
}

int add_caller_object(const char* path) {
  return collect_ranges([path](dl_phdr_info* info) { return strcmp(info->dlpi_name, path) == 0; },
                        g_callers, &g_ncallers);
}

// ---- exec mode: the program's calls ------------------------------------------------------------
//
// In a program `umbp-sim exec` started, every call of the program is the simulated host's, on
// every thread, but the calls of the language runtime under it and of umbp-sim itself: the C
// library and the loader (their own calls never reach us; what they forward does), the C++
// runtime, the Python interpreter (its object allocator's arenas are the interpreter's memory,
// not the program's: on the simulated host they would count against its memory and trap every
// touch), the interposer and libumbp_sim_exec.so (the Kernel's own real memory). So mori's C++
// test binary and the allocator compiled into it, a library it loads, a Python extension module
// (mori's, or ctypes' calls through libffi) all see one simulated host: the test's own probes of
// it (sysconf, /proc/meminfo, the node directories) agree with what the allocator gets, which is
// what makes the test's checks and skips mean something. Objects are classified on their first
// call (dl_iterate_phdr), so a module loaded later is classified when it calls. Memory is
// either the host's or this box's: a munmap, madvise or mbind of a range no simulated mapping
// meets is the real kernel's, whoever calls (route_range: the C library's malloc gave it).
namespace {

bool runtime_object(const char* path) {
  const char* base = strrchr(path, '/');
  base = base ? base + 1 : path;
  static const char* const kRuntime[] = {"ld-linux",  "ld64.so",    "libc.so",      "libm.so",
                                         "libstdc++", "libgcc_s",   "libpthread",   "libdl.so",
                                         "librt.so",  "linux-vdso", "libumbp_sim_", "_native."};
  for (const char* prefix : kRuntime)
    if (strncmp(base, prefix, strlen(prefix)) == 0) return true;
  return false;
}

// The object holding `addr`: its executable segments into the program's or the runtime's ranges.
void classify(uintptr_t addr) {
  struct Ctx {
    uintptr_t addr;
    bool found;
  } ctx{addr, false};
  dl_iterate_phdr(
      [](struct dl_phdr_info* info, size_t, void* data) -> int {
        auto* c = static_cast<Ctx*>(data);
        bool holds = false, python = false;
        const uintptr_t py = g_python_fn.load();
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD) continue;
          const uintptr_t lo = info->dlpi_addr + ph.p_vaddr, hi = lo + ph.p_memsz;
          holds = holds || (c->addr >= lo && c->addr < hi);
          python = python || (py >= lo && py < hi);
        }
        if (!holds) return 0;
        c->found = true;
        const bool runtime = python || runtime_object(info->dlpi_name ? info->dlpi_name : "");
        Range* out = runtime ? g_real : g_callers;
        std::atomic<int>* count = runtime ? &g_nreal : &g_ncallers;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X)) continue;
          const int n = count->load();
          if (n >= kMaxRanges) break;
          const uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
          out[n] = Range{lo, lo + ph.p_memsz};
          count->store(n + 1, std::memory_order_release);
        }
        return 1;
      },
      &ctx);
  if (!ctx.found) {  // code outside every object (generated code): not the program's calls
    const int n = g_nreal.load();
    if (n < kMaxRanges) {
      g_real[n] = Range{addr, addr + 1};
      g_nreal.store(n + 1, std::memory_order_release);
    }
  }
}

bool program_caller_at(uintptr_t r) {
  if (r >= g_self.lo && r < g_self.hi) return false;
  for (int pass = 0; pass < 2; ++pass) {
    if (in(g_callers, g_ncallers.load(std::memory_order_acquire), r)) return true;
    if (in(g_real, g_nreal.load(std::memory_order_acquire), r)) return false;
    if (pass == 0) {
      std::lock_guard<std::mutex> l(g_classify_mu);
      if (!in(g_callers, g_ncallers.load(), r) && !in(g_real, g_nreal.load(), r)) classify(r);
    }
  }
  return false;
}

}  // namespace

const char* hidden_by(const char* name) {
  find_forwarders();
  void* first = dlsym(RTLD_DEFAULT, name);
  Dl_info info;
  if (!first || !dladdr(first, &info) || !info.dli_fname) return nullptr;
  const auto f = reinterpret_cast<uintptr_t>(first);
  if (f >= g_self.lo && f < g_self.hi) return nullptr;
  if (in(g_forwarders, g_nforwarders.load(), f)) return nullptr;  // it forwards to us
  // A sanitizer runtime linked into the program (clang's default) intercepts and forwards too.
  Dl_info runtime;
  void* sanitizer = dlsym(RTLD_DEFAULT, "__sanitizer_set_report_path");
  if (sanitizer && dladdr(sanitizer, &runtime) && runtime.dli_fbase == info.dli_fbase)
    return nullptr;
  return *info.dli_fname ? info.dli_fname : "the program itself";
}

void route_whole_program(const void* kernel_code) {
  find_forwarders();
  void* py = dlsym(RTLD_DEFAULT, "Py_IsInitialized");
  g_python_fn.store(reinterpret_cast<uintptr_t>(py));
  // The Kernel's object classified now, before the program runs: its real calls, made under the
  // Kernel's lock, then never take g_classify_mu and the loader's lock (dl_iterate_phdr).
  program_caller_at(reinterpret_cast<uintptr_t>(kernel_code));
  g_program.store(true);
}

}  // namespace umbp_interpose
