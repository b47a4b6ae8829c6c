// A routed call answered by the Kernel: mmap (a simulated mapping trapped), munmap, mbind,
// memfd_create, ftruncate, close, madvise, and opens of /proc and /sys (a memfd holding the
// Kernel's rendering).
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>

#include "interposer/interposer_internal.h"

namespace umbp_interpose {

namespace {
// The program's own path (dladdr names the main program ""), read once.
const char* program_path() {
  static char path[PATH_MAX] = {0};
  static const bool read = [] {
    const long n = raw(SYS_readlink, L("/proc/self/exe"), L(path), sizeof path - 1);
    path[n > 0 ? n : 0] = '\0';
    return true;
  }();
  (void)read;
  return path[0] ? path : nullptr;
}
}  // namespace

void note_site(const umbp_sim_kernel* k, void* ret) {
  if (!(k->ops->flags & UMBP_SIM_KERNEL_CALL_SITES)) return;
  const char* object = nullptr;
  unsigned long offset = 0;
  Dl_info info;
  if (ret && dladdr(ret, &info) && info.dli_fbase) {
    object = info.dli_fname && info.dli_fname[0] ? info.dli_fname : program_path();
    // The call instruction's last byte: the return address may be the next line's first.
    offset = reinterpret_cast<uintptr_t>(ret) - 1 - reinterpret_cast<uintptr_t>(info.dli_fbase);
  }
  k->ops->set_call_site(k->self, object, offset);
}

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

long do_move_pages(const umbp_sim_kernel* k, long pid, unsigned long count, void** pages,
                   const int* nodes, int* status, int flags, bool* answered) {
  *answered = false;
  if (!g_simulated || (pid != 0 && pid != ::getpid()) || !pages || !status) return 0;
  bool any = false;
  for (unsigned long i = 0; i < count && !any; ++i)
    any = k->ops->page_node(k->self, pages[i]) != -EFAULT;
  if (!any) return 0;  // none of them is the Kernel's: the real call
  *answered = true;
  if (nodes) {  // a move of a simulated page: the simulated host does not move pages
    errno = ENOSYS;
    return -1;
  }
  for (unsigned long i = 0; i < count; ++i) {
    const int node = k->ops->page_node(k->self, pages[i]);
    if (node != -EFAULT)
      status[i] = node;
    else if (raw(SYS_move_pages, 0, 1, L(&pages[i]), 0, L(&status[i]), flags) != 0)
      status[i] = -errno;
  }
  return 0;
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

FILE* fopen_rendered(const umbp_sim_kernel* k, const char* path, const char* mode) {
  int fd = open_rendered(k, path);
  if (fd < 0) return nullptr;
  FILE* f = fdopen(fd, mode && mode[0] ? mode : "r");
  if (!f) sys_close(fd);
  return f;
}

}  // namespace umbp_interpose
