// What the parts of libumbp_sim_interpose.so share (see csrc/capi/umbp_sim/interposer.h for
// what the library does). One file per concern:
//   routing.cpp        whose call it is: the active Kernel, caller objects, simulated fds
//   symbols.cpp        the interposed symbols (LD_PRELOAD names and -Wl,--wrap names)
//   calls.cpp          a routed call answered by the Kernel (mmap, munmap, opens of /proc...)
//   mappings.cpp       simulated mappings: their trap, the grants of real pages, a fault
//   fault_sigsegv.cpp  the PROT_NONE fault path (SIGSEGV handler)
//   fault_uffd.cpp     the userfaultfd fault path (resolver thread) and fork()
//   death.cpp          a simulated death: the evidence frame for umbp-sim, then the signal
//   control.cpp        the control API (extern "C")
// Everything here is hidden (the target's visibility is hidden): only the control API and the
// interposed symbols are exported.
#pragma once

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <mutex>

#include "umbp_sim/interposer.h"

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif

// A function ThreadSanitizer's runtime reaches while it initializes (it is preloaded before this
// library in the TSan tier, and calls sysconf and sigaction then): not instrumented, since an
// instrumented function entered before the runtime is ready crashes. Such a function calls only
// others marked so (or the C library) on that path, and reads shared state with __atomic builtins.
#if defined(__SANITIZE_THREAD__)
#define UMBP_NO_TSAN __attribute__((no_sanitize("thread")))
#else
#define UMBP_NO_TSAN
#endif

namespace umbp_interpose {

// ---- real calls that never come back into this library (it defines syscall, mmap, close...) --

long raw(long nr, long a1 = 0, long a2 = 0, long a3 = 0, long a4 = 0, long a5 = 0, long a6 = 0);
// The definition of `name` after this library (RTLD_NEXT), or the C library's when nothing
// after it has one (an object preloaded before this library).
void* next_symbol(const char* name);
inline long L(const void* p) { return reinterpret_cast<long>(p); }
inline void* sys_mmap(void* a, size_t n, int prot, int flags, int fd, off_t off) {
  return reinterpret_cast<void*>(raw(SYS_mmap, L(a), static_cast<long>(n), prot, flags, fd, off));
}
inline int sys_munmap(void* a, size_t n) {
  return static_cast<int>(raw(SYS_munmap, L(a), static_cast<long>(n)));
}
inline int sys_mprotect(void* a, size_t n, int prot) {
  return static_cast<int>(raw(SYS_mprotect, L(a), static_cast<long>(n), prot));
}
inline void* sys_mremap(void* a, size_t n, size_t m, int flags, void* to) {
  return reinterpret_cast<void*>(
      raw(SYS_mremap, L(a), static_cast<long>(n), static_cast<long>(m), flags, L(to)));
}
inline int sys_close(int fd) { return static_cast<int>(raw(SYS_close, fd)); }
inline int sys_ioctl(int fd, unsigned long req, void* arg) {
  return static_cast<int>(raw(SYS_ioctl, fd, static_cast<long>(req), L(arg)));
}
inline long raw_madvise(uintptr_t a, size_t n, int advice) {
  return raw(SYS_madvise, static_cast<long>(a), static_cast<long>(n), advice);
}

inline uintptr_t align_down(uintptr_t v, uintptr_t a) { return v / a * a; }
inline uintptr_t align_up(uintptr_t v, uintptr_t a) { return (v + a - 1) / a * a; }

// ---- routing (routing.cpp) ----------------------------------------------------------------------

extern std::atomic<const umbp_sim_kernel*> g_kernel;
extern std::atomic<bool> g_program;    // exec mode: the whole program's calls (route_whole_program)
extern umbp_sim_kernel g_kernel_copy;  // the handle activate() was given (ops + self), retained
extern bool g_simulated;
extern size_t g_page;
extern __thread int t_scope;
extern std::atomic<unsigned long> g_routed, g_faults, g_moved;
// Lock order, outermost first (a thread holding one may take those below it, never above):
//   g_fd_mu             the simulated fds' writers (add_sim_fd, drop_sim_fd; fork() takes it)
//   g_map_mu            the mapping and grant tables (mappings.cpp): held by a fault's resolver
//                       (the SIGSEGV handler, the userfaultfd thread) across the Kernel's touch
//   the Kernel's locks  TracingKernel, FaultyKernel, SimKernel::mu_ (a call through the C ABI)
//   leaf locks          g_classify_mu, SimKernel's UnbackedSpace, memory_lifetimes
// A Kernel holding its lock makes real calls (mmap, munmap, close: sim_address_space.cpp,
// user_memory.cpp) that come back through this library: they must be decided without g_fd_mu or
// g_map_mu. So routing asks whose call it is before whose memory (route_range), the Kernel's
// object is classified before the program runs (route_whole_program), and is_sim_fd reads the
// fd table without g_fd_mu. Nothing here calls the Kernel with a lock held but g_map_mu.
extern std::mutex g_fd_mu;  // guards the simulated fds' writers (is_sim_fd takes no lock)
extern std::atomic<int> g_nfds;

bool is_sim_fd(int fd);
void add_sim_fd(int fd);
void drop_sim_fd(int fd);
void find_forwarders();
int add_caller_object(const char* path);
// The Kernel when this call is the allocator's (wrapped: its object; preload: its caller).
const umbp_sim_kernel* route(bool wrapped, void* ret);
const umbp_sim_kernel* kernel_for_fd(int fd);
// Opens of /proc and /sys count for the thread inside enter()/leave() (exec mode: every thread),
// whoever calls.
const umbp_sim_kernel* route_open(const char* path);
// Exec mode: every call of the program is the Kernel's, on every thread, but the language
// runtime's and umbp-sim's own (routing.cpp says which and why). `kernel_code`: an address in
// the object that holds the Kernel (libumbp_sim_exec.so), classified now as the runtime's.
void route_whole_program(const void* kernel_code);
// The object whose `name` a program's call reaches instead of this library's (loaded before it
// and not a sanitizer runtime, which forwards to us), or nullptr.
const char* hidden_by(const char* name);
// The Kernel for a call on [addr, addr+len) (munmap, madvise, mbind): route()'s answer, but in
// exec mode a range that meets no simulated mapping is real memory (the C library's malloc
// gave it): the real kernel's, whoever calls. The caller is decided first: g_map_mu is taken
// only for a call that is the program's.
const umbp_sim_kernel* route_range(bool wrapped, void* ret, void* addr, size_t len);

// ---- the simulated host's /proc and /sys in exec mode (sim_paths.cpp) ---------------------------

enum class PathKind { Real, File, Directory, Missing };
void set_sim_root(const char* root);  // <dir>/root: the rendered tree
bool have_sim_root();
// What the simulated host has at `path` (`rendered`: the path of its copy under the root).
PathKind sim_path_kind(const char* path, char* rendered, size_t cap);
// open/fopen/opendir of a path the simulated host answers: *answered false when it is this
// box's (the caller then makes the real call).
int open_sim_path(const umbp_sim_kernel* k, const char* path, int flags, int mode, bool* answered);
FILE* fopen_sim_path(const umbp_sim_kernel* k, const char* path, const char* mode, bool* answered);
DIR* opendir_sim_path(const char* path, DIR* (*real_opendir)(const char*), bool* answered);

// ---- simulated mappings (mappings.cpp) ----------------------------------------------------------

// A "big" grant: one aligned 32 MiB block (16 THPs). A page-by-page touch of a huge buffer costs
// one trap (signal, Kernel touch, mremap, refill) per grant: 32 MiB blocks make that a fifth of
// its time (1.5 TiB: 49k traps), and one block fits the default resident limit.
constexpr size_t kBig = size_t{32} << 20;

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
extern std::mutex g_map_mu;  // guards the mapping and grant tables and the resident counts
extern Map g_maps[];
extern int g_nmaps;
extern Grant g_grants[];
extern int g_ngrants;
extern size_t g_res_big, g_res_small, g_resident_limit;

Map* find_map(uintptr_t a);
// Whether [lo, hi) (hi == lo: the page at lo) meets a simulated mapping (takes g_map_mu).
bool overlaps_sim_map(uintptr_t lo, uintptr_t hi);
void add_map(uintptr_t start, uintptr_t end, int prot, bool uffd);
// Forget [lo, hi) in the mapping and grant tables (its real pages are being replaced).
void forget_range(uintptr_t lo, uintptr_t hi);
// Trap touches of a new simulated mapping; returns whether registered (userfaultfd path).
bool trap(uintptr_t start, uintptr_t end, int prot);
// A fault at `addr` inside `m` (g_map_mu held): 0 with the run granted up to *granted_end, or
// the signal the Kernel answered with.
int handle_fault(const umbp_sim_kernel* k, Map& m, uintptr_t addr, bool write,
                 uintptr_t* granted_end);

// ---- fault paths (fault_sigsegv.cpp, fault_uffd.cpp) --------------------------------------------

extern int g_want_path;              // for the next activate()
extern std::atomic<int> g_path;      // the active one
extern char g_uffd_why[256];         // why the last start of the userfaultfd path failed
extern struct sigaction g_old_segv;  // the SIGSEGV handler before ours
// A simulated death found by the resolver thread: the faulting thread's next touch of this page
// traps (the page is made PROT_NONE) and its SIGSEGV handler dies of g_death_sig there.
extern std::atomic<uintptr_t> g_death_page;
extern std::atomic<int> g_death_sig;

void install_handler();
void remove_handler();
// sigaction(2) itself (the program's calls of sigaction reach ours, symbols.cpp).
UMBP_NO_TSAN int real_sigaction(int sig, const struct sigaction* act, struct sigaction* old);
// Exec mode: the program's SIGSEGV handler goes behind ours (Python's faulthandler, which pytest
// enables, would otherwise take every simulated page touch of the PROT_NONE path for a crash):
// program_sigaction answers its sigaction(SIGSEGV) with the handler ours chains to (true), or
// says it is not one of those (false: the real call).
void keep_segv_handler_first();
UMBP_NO_TSAN bool program_sigaction(int sig, const struct sigaction* act, struct sigaction* old);
bool uffd_register(uintptr_t start, size_t len);
// Real pages for the missing range [start, end) of a registered mapping.
bool uffd_fill(uintptr_t start, uintptr_t end, bool write);
bool uffd_unregister(uintptr_t start, size_t len);
int open_uffd(char* why, size_t cap);
bool start_uffd(char* why, size_t cap);
void stop_uffd();
void register_fork_handlers();

// ---- a simulated death (death.cpp) --------------------------------------------------------------

// Where a simulated death's evidence goes (umbp_sim_interposer_set_evidence_fd).
void set_evidence_fd(int fd);
void forget_evidence_fd_in_fork_child();
// Exec mode: a fork's child keeps the fd (a program the program starts writes frames of its own,
// naming its pid; a run of the allocator's server closes it: its fork's death is not the run's).
void keep_evidence_fd_in_forks();
// Exec mode: the run's token (hex, from the host directory), first in every frame, so that a
// frame on the pipe that is not the interposer's is told from one that is.
void set_evidence_token(const char* hex);
// The Kernel says the process is dead: hand umbp-sim the evidence, then die of `sig`.
[[noreturn]] void die_of(const umbp_sim_kernel* k, int sig, const char* stage);
// A routed call's failure: errno and -1, or death when the Kernel answered with a signal.
int fail(const umbp_sim_kernel* k, const umbp_sim_result& r, const char* stage);
// Exec mode: the exit frame (atexit), and why the simulated host did not start.
void report_exit();
void report_setup_error(const char* text);

// ---- the routed calls (calls.cpp) ---------------------------------------------------------------

// Tells the Kernel where the routed call about to be made comes from: `ret`, the interposed
// symbol's return address, as its object and offset (dladdr), recorded with the call by a
// TracingKernel in the stack (what compare shows as the call's source line). Only the calls of
// the seam (mmap, munmap, madvise, mbind, memfd_create, ftruncate, close) carry one.
void note_site(const umbp_sim_kernel* k, void* ret);
void* do_mmap(const umbp_sim_kernel* k, void* addr, size_t len, int prot, int flags, int fd,
              off_t off);
int do_munmap(const umbp_sim_kernel* k, void* addr, size_t len);
long do_mbind(const umbp_sim_kernel* k, void* addr, unsigned long len, int mode,
              const unsigned long* mask, unsigned long maxnode, unsigned flags);
int do_memfd(const umbp_sim_kernel* k, const char* name, unsigned flags);
// move_pages(2) in query mode for the Kernel's pages (*answered false: the real call's).
long do_move_pages(const umbp_sim_kernel* k, long pid, unsigned long count, void** pages,
                   const int* nodes, int* status, int flags, bool* answered);
int do_ftruncate(const umbp_sim_kernel* k, int fd, off_t len);
int do_close(const umbp_sim_kernel* k, int fd);
int do_madvise(const umbp_sim_kernel* k, void* addr, size_t len, int advice);
int open_rendered(const umbp_sim_kernel* k, const char* path);
FILE* fopen_rendered(const umbp_sim_kernel* k, const char* path, const char* mode);

}  // namespace umbp_interpose
