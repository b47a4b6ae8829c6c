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

long raw(long nr, long a1, long a2, long a3, long a4, long a5, long a6) {
  static syscall_fn f = reinterpret_cast<syscall_fn>(dlsym(RTLD_NEXT, "syscall"));
  return f(nr, a1, a2, a3, a4, a5, a6);
}

std::atomic<const umbp_sim_kernel*> g_kernel{nullptr};
umbp_sim_kernel g_kernel_copy;
bool g_simulated = false;
size_t g_page = 4096;

__thread int t_scope = 0;

namespace {
constexpr int kMaxRanges = 256;
struct Range {
  uintptr_t lo, hi;
};
Range g_callers[kMaxRanges];
std::atomic<int> g_ncallers{0};
}  // namespace

std::atomic<unsigned long> g_routed{0}, g_faults{0}, g_moved{0};

// Simulated fds (from the Kernel's memfd_create).
namespace {
constexpr int kMaxFds = 1024;
int g_fds[kMaxFds];
}  // namespace
std::mutex g_fd_mu;
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

const umbp_sim_kernel* route_open(const char* path) {
  if (!path || (strncmp(path, "/proc/", 6) != 0 && strncmp(path, "/sys/", 5) != 0)) return nullptr;
  const umbp_sim_kernel* k = g_kernel.load(std::memory_order_acquire);
  return (k && t_scope > 0) ? k : nullptr;
}

int add_caller_object(const char* path) {
  return collect_ranges([path](dl_phdr_info* info) { return strcmp(info->dlpi_name, path) == 0; },
                        g_callers, &g_ncallers);
}

}  // namespace umbp_interpose
