// A program `umbp-sim exec` started (umbp_sim/exec_host/machine_dir.py): the interposer is
// preloaded, and before main() it starts the simulated host that umbp-sim described and routes
// the program's calls to it (routing.cpp, route_whole_program). Nothing of Python runs here: the
// program may be a C++ test binary.
//
// What umbp-sim passes, in the environment (so a program the program execs gets its own fresh
// copy of the same host, as with umockdev-run or faketime):
//   UMBP_SIM_EXEC=<dir>               a private directory: host.json (the SimConfig and fault
//                                     rules as data, capi/exec_host.h), root/ (the host's
//                                     rendered /proc and /sys, sim_paths.cpp) and token (the
//                                     run's, in hex: first in every evidence frame)
//   UMBP_SIM_EXEC_EVIDENCE=fd:dev:ino the pipe for the evidence frames (death.cpp); taken only
//                                     when fd is still that pipe (a process that closed it may
//                                     have the number reused), kept across exec and fork: every
//                                     process of the program writes frames naming its pid
//   UMBP_SIM_FAULT_PATH=uffd|sigsegv|auto (optional) the fault path
// The host is started by libumbp_sim_exec.so beside this library (dlopen): the interposer itself
// stays on the C ABI. When the host cannot start, the program does not run on the real host:
// an error frame (or a line on stderr) and exit status 70.
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "capi/exec_host.h"
#include "interposer/interposer_internal.h"

namespace umbp_interpose {
namespace {

constexpr int kSetupFailed = 70;  // EX_SOFTWARE

[[noreturn]] void setup_failed(const char* what, const char* why) {
  char text[1024];
  snprintf(text, sizeof text, "the simulated host did not start: %s%s%s", what, why ? ": " : "",
           why ? why : "");
  report_setup_error(text);
  _exit(kSetupFailed);
}

// The evidence pipe named by UMBP_SIM_EXEC_EVIDENCE, if this process still has it.
int evidence_pipe() {
  const char* spec = getenv("UMBP_SIM_EXEC_EVIDENCE");
  if (!spec) return -1;
  int fd = -1;
  unsigned long long dev = 0, ino = 0;
  if (sscanf(spec, "%d:%llu:%llu", &fd, &dev, &ino) != 3 || fd < 0) return -1;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode) || st.st_dev != dev || st.st_ino != ino)
    return -1;
  return fd;
}

// <dir>/token into the evidence frames (death.cpp); none there: frames without it, which
// umbp-sim refuses.
void read_token(const char* dir) {
  char path[PATH_MAX];
  if (snprintf(path, sizeof path, "%s/token", dir) >= PATH_MAX) return;
  // Raw calls: this library defines open and close (they would route here).
  const int fd = static_cast<int>(raw(SYS_openat, AT_FDCWD, L(path), O_RDONLY | O_CLOEXEC));
  if (fd < 0) return;
  char hex[65] = "";
  const long n = raw(SYS_read, fd, L(hex), static_cast<long>(sizeof hex - 1));
  sys_close(fd);
  hex[n > 0 ? n : 0] = '\0';
  set_evidence_token(hex);
}

int fault_path_from_env() {
  const char* want = getenv("UMBP_SIM_FAULT_PATH");
  if (!want || !*want || strcmp(want, "auto") == 0) return UMBP_SIM_FAULT_PATH_AUTO;
  if (strcmp(want, "uffd") == 0) return UMBP_SIM_FAULT_PATH_UFFD;
  if (strcmp(want, "sigsegv") == 0) return UMBP_SIM_FAULT_PATH_SIGSEGV;
  setup_failed("UMBP_SIM_FAULT_PATH", "expected uffd, sigsegv or auto");
}

// libumbp_sim_exec.so beside this library.
void provider_path(char* out, size_t cap) {
  Dl_info me;
  out[0] = '\0';
  if (!dladdr(reinterpret_cast<void*>(&provider_path), &me) || !me.dli_fname) return;
  const char* slash = strrchr(me.dli_fname, '/');
  const int dir = slash ? static_cast<int>(slash - me.dli_fname) : 1;
  snprintf(out, cap, "%.*s/libumbp_sim_exec.so", dir, slash ? me.dli_fname : ".");
}

void start_exec_host() {
  const char* dir = getenv("UMBP_SIM_EXEC");
  if (!dir || !*dir) return;
  read_token(dir);
  set_evidence_fd(evidence_pipe());  // first: a failure below is reported there
  keep_evidence_fd_in_forks();
  // umbp-sim puts this library before what else is preloaded; a process that reordered
  // LD_PRELOAD would run with its calls on the real host while counted as simulated.
  if (const char* other = hidden_by("mmap")) {
    char why[PATH_MAX + 128];
    snprintf(why, sizeof why,
             "%s is loaded before the interposer and answers the program's mmap; preload it "
             "after the interposer",
             other);
    setup_failed("LD_PRELOAD", why);
  }
  char path[PATH_MAX];
  provider_path(path, sizeof path);
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) setup_failed("cannot load libumbp_sim_exec.so", dlerror());
  auto start = reinterpret_cast<umbp_sim_exec_start_fn>(dlsym(lib, UMBP_SIM_EXEC_START_SYMBOL));
  if (!start) setup_failed(path, "no " UMBP_SIM_EXEC_START_SYMBOL);
  char host_file[PATH_MAX];
  if (snprintf(host_file, sizeof host_file, "%s/host.json", dir) >= PATH_MAX)
    setup_failed("UMBP_SIM_EXEC", "path too long");
  umbp_sim_exec_host host{};
  char err[512] = "";
  if (start(host_file, &host, err, sizeof err) != 0) setup_failed(host_file, err);
  char root[PATH_MAX];
  if (snprintf(root, sizeof root, "%s/root", dir) >= PATH_MAX)
    setup_failed("UMBP_SIM_EXEC", "path too long");
  set_sim_root(root);
  umbp_sim_interposer_set_fault_path(fault_path_from_env());
  const int rc = umbp_sim_interposer_activate(host.kernel);
  host.kernel->ops->release(host.kernel->self);  // activate() holds its own reference
  if (rc == EOPNOTSUPP)
    setup_failed("UMBP_SIM_FAULT_PATH=uffd: userfaultfd does not work here", g_uffd_why);
  if (rc != 0) setup_failed("umbp_sim_interposer_activate", strerror(rc));
  keep_segv_handler_first();
  route_whole_program(reinterpret_cast<const void*>(start));
  atexit(report_exit);
}

}  // namespace
}  // namespace umbp_interpose

__attribute__((constructor)) static void umbp_sim_exec_constructor() {
  umbp_interpose::start_exec_host();
}
