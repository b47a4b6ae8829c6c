// The PROT_NONE fault path: a touch of a simulated mapping is a SIGSEGV (SEGV_ACCERR) that the
// handler answers with the Kernel's touch and a grant; on both paths the handler is where a
// faulting thread dies of a simulated signal. Other SIGSEGVs go to the handler before ours.
#include <dlfcn.h>
#include <string.h>

#include "interposer/interposer_internal.h"

namespace umbp_interpose {

struct sigaction g_old_segv;

namespace {
bool g_handler_installed = false;
bool g_segv_first = false;  // keep_segv_handler_first() (__atomic: read by UMBP_NO_TSAN code)

using sigaction_fn = int (*)(int, const struct sigaction*, struct sigaction*);
sigaction_fn g_real_sigaction = nullptr;  // looked up before any handler runs

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
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  real_sigaction(SIGSEGV, &dfl, nullptr);
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

}  // namespace

UMBP_NO_TSAN int real_sigaction(int sig, const struct sigaction* act, struct sigaction* old) {
  sigaction_fn f = __atomic_load_n(&g_real_sigaction, __ATOMIC_RELAXED);
  if (!f) {
    f = reinterpret_cast<sigaction_fn>(next_symbol("sigaction"));
    __atomic_store_n(&g_real_sigaction, f, __ATOMIC_RELAXED);
  }
  return f(sig, act, old);
}

void keep_segv_handler_first() { __atomic_store_n(&g_segv_first, true, __ATOMIC_RELEASE); }

UMBP_NO_TSAN bool program_sigaction(int sig, const struct sigaction* act, struct sigaction* old) {
  if (sig != SIGSEGV || !__atomic_load_n(&g_segv_first, __ATOMIC_ACQUIRE) || !g_handler_installed)
    return false;
  const struct sigaction previous = g_old_segv;
  if (act) g_old_segv = *act;
  if (old) *old = previous;
  return true;
}

void install_handler() {
  real_sigaction(SIGSEGV, nullptr, nullptr);  // the lookup, now: not inside a handler
  if (g_handler_installed) return;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  if (real_sigaction(SIGSEGV, &sa, &g_old_segv) == 0) g_handler_installed = true;
}

void remove_handler() {
  if (g_handler_installed) {
    real_sigaction(SIGSEGV, &g_old_segv, nullptr);
    g_handler_installed = false;
  }
}

}  // namespace umbp_interpose
