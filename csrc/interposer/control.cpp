// The control API (csrc/capi/umbp_sim/interposer.h): activate a Kernel, choose the fault path,
// name the allocator's objects and threads, hand over the evidence fd, read the counters.
#include <fcntl.h>
#include <stdio.h>
#include <string.h>

#include <algorithm>

#include "interposer/interposer_internal.h"

using namespace umbp_interpose;

extern "C" {

int umbp_sim_interposer_version(void) { return UMBP_SIM_INTERPOSER_VERSION; }

int umbp_sim_interposer_activate(const umbp_sim_kernel* kernel) {
  if (!kernel || !kernel->ops || kernel->ops->abi_version != UMBP_SIM_KERNEL_ABI_VERSION)
    return EINVAL;
  umbp_sim_interposer_deactivate();
  register_fork_handlers();
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
  remove_handler();
  if (k) k->ops->release(k->self);
}

int umbp_sim_interposer_add_caller_object(const char* path) { return add_caller_object(path); }

int umbp_sim_interposer_set_evidence_fd(int fd) {
  // Close-on-exec: a program the allocator starts does not get it.
  if (fd >= 0 && fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) return errno;
  set_evidence_fd(fd);
  register_fork_handlers();  // a fork of the run's process closes its copy
  return 0;
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
