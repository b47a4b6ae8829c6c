// A simulated death (the Kernel answered a call or a page touch with a signal: SIGBUS, an OOM
// SIGKILL): the evidence for umbp-sim, then the real signal.
//
// The evidence is one frame on the fd umbp-sim gave (umbp_sim_interposer_set_evidence_fd): a
// 4-byte big-endian length, then a JSON object {"event": "death", "pid": <the process>,
// "signal": <number>, "stage": "page touch" | the call, "kernel": the Kernel's post-mortem
// (describe 3: its crash record, its reasons and the syscall trace)}; umbp_sim/external/evidence.py
// reads it. Nothing is written to stderr then: stderr is the allocator's log. Without an evidence
// fd (the interposer preloaded by hand) one line for a person goes to stderr instead.
//
// A program `umbp-sim exec` started (exec_mode.cpp) writes two more events on the same fd: at a
// normal exit {"event": "exit", "pid", "stats": the interposer's counters, "kernel": the
// post-mortem} (a death frame has the "stats" too), and when its simulated host cannot start
// {"event": "error", "pid", "text"}. Each of its frames begins with the run's token
// ({"token": "<hex>", "event": ...}: set_evidence_token), which umbp-sim checks.
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>

#include "interposer/interposer_internal.h"

namespace umbp_interpose {

namespace {

constexpr int kNoFd = -1;    // no evidence fd: one line on stderr
constexpr int kForked = -2;  // a fork of the run's process: the run's evidence is not its own
constexpr int kGone = -3;    // the fd no longer names the evidence pipe: nothing is written
std::atomic<int> g_evidence_fd{kNoFd};
// The evidence fd's file when it was given: the process may have closed the fd since and the
// number may name another file now (a program that closes every fd above 2, then opens one).
dev_t g_evidence_dev = 0;
ino_t g_evidence_ino = 0;

// The evidence fd, if it is still the file it was (-1 when not, or none); async-signal-safe.
int evidence_fd_now() {
  const int fd = g_evidence_fd.load(std::memory_order_acquire);
  if (fd < 0) return fd;
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_dev != g_evidence_dev || st.st_ino != g_evidence_ino)
    return kGone;
  return fd;
}
char g_token[65] = "";  // exec mode: the run's token (hex), set before any frame is written
std::atomic<bool> g_dying{false};          // one dying thread reports; another waits for the end
std::atomic<bool> g_keep_in_forks{false};  // keep_evidence_fd_in_forks

void put_all(int fd, const char* s, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, s, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    s += w;
    n -= static_cast<size_t>(w);
  }
}
void put(const char* s) { put_all(2, s, strlen(s)); }
// A frame's first 4 bytes: its length, big-endian.
void put_len(char* frame, uint32_t len) {
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>(len >> (24 - 8 * i));
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

// Text appended at buf[at] (the caller sized buf); returns the new end. No snprintf: this runs
// where the process is dying, perhaps in a signal handler.
size_t append(char* buf, size_t at, const char* s) {
  const size_t n = strlen(s);
  memcpy(buf + at, s, n);
  return at + n;
}
size_t append_number(char* buf, size_t at, unsigned long v) {
  char digits[24];
  int n = 0;
  do {
    digits[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v);
  while (n > 0) buf[at++] = digits[--n];
  return at;
}

// Memory of its own (mmap, not malloc: the dying thread may have stopped inside malloc).
class Pages {
 public:
  explicit Pages(size_t n) : n_(n) {
    void* m = sys_mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    p_ = m == MAP_FAILED ? nullptr : static_cast<char*>(m);
  }
  ~Pages() {
    if (p_) sys_munmap(p_, n_);
  }
  Pages(const Pages&) = delete;
  Pages& operator=(const Pages&) = delete;
  char* get() const { return p_; }

 private:
  char* p_;
  size_t n_;
};

void write_frame_with_postmortem(int fd, const umbp_sim_kernel* k, const char* head, size_t nh);

// `{"token": "<hex>", ` when the run has one (exec mode), else `{`: a frame's first bytes.
size_t append_open(char* buf, size_t at) {
  at = append(buf, at, "{");
  if (g_token[0] == '\0') return at;
  at = append(buf, at, "\"token\": \"");
  at = append(buf, at, g_token);
  return append(buf, at, "\", ");
}

// `, "stats": {...}`: the interposer's counters that need no lock (a death may come while a
// thread holds the mapping table's).
size_t append_stats(char* buf, size_t at) {
  at = append(buf, at, ", \"stats\": {\"routed\": ");
  at = append_number(buf, at, g_routed.load());
  at = append(buf, at, ", \"faults\": ");
  at = append_number(buf, at, g_faults.load());
  at = append(buf, at, ", \"moved\": ");
  at = append_number(buf, at, g_moved.load());
  at = append(buf, at, ", \"sim_fds\": ");
  at = append_number(buf, at, static_cast<unsigned long>(g_nfds.load()));
  return append(buf, at, "}");
}

// The evidence frame on `fd`.
void write_evidence(int fd, const umbp_sim_kernel* k, int sig, const char* stage) {
  char head[512];
  size_t nh = append_open(head, 0);
  nh = append(head, nh, "\"event\": \"death\", \"pid\": ");
  nh = append_number(head, nh, static_cast<unsigned long>(::getpid()));
  nh = append(head, nh, ", \"signal\": ");
  nh = append_number(head, nh, static_cast<unsigned long>(sig));
  nh = append(head, nh, ", \"stage\": \"");
  nh = append(head, nh, stage);  // one of this library's own names: nothing to escape
  nh = append(head, nh, "\"");
  nh = append_stats(head, nh);
  nh = append(head, nh, ", \"kernel\": ");
  write_frame_with_postmortem(fd, k, head, nh);
}

// head (nh bytes), the Kernel's post-mortem, "}": one frame on fd.
void write_frame_with_postmortem(int fd, const umbp_sim_kernel* k, const char* head, size_t nh) {
  size_t n = k->ops->describe(k->self, 3, nullptr, 0);
  for (int attempt = 0; attempt < 3; ++attempt) {
    Pages buf(4 + nh + n + 2);  // length, head, the post-mortem and its NUL, "}"
    char* frame = buf.get();
    if (!frame) return;
    memcpy(frame + 4, head, nh);
    const size_t got = k->ops->describe(k->self, 3, frame + 4 + nh, n + 1);
    if (got != n) {  // another thread's call changed it in between: again, at its new length
      n = got;
      continue;
    }
    frame[4 + nh + n] = '}';
    const auto len = static_cast<uint32_t>(nh + n + 1);
    put_len(frame, len);
    put_all(fd, frame, 4 + len);
    return;
  }
}

// One line for a person reading stderr (never read back by umbp-sim).
void human_line(const umbp_sim_kernel* k, int sig, const char* stage) {
  char text[512];
  const size_t n = k->ops->describe(k->self, 0, text, sizeof text);  // a longer one is cut
  put("umbp-sim: simulated ");
  put(sig_name(sig));
  put(" (");
  put(stage);
  put("): ");
  put(n == 0 ? "injected" : text);
  put("\n");
}

struct DeathReport {
  const umbp_sim_kernel* k;
  int sig;
  const char* stage;
};

void report_death(const DeathReport& d) {
  const int fd = evidence_fd_now();
  if (fd >= 0)
    write_evidence(fd, d.k, d.sig, d.stage);
  else if (fd == kNoFd)
    human_line(d.k, d.sig, d.stage);
}

void* report_death_thread(void* arg) {
  report_death(*static_cast<const DeathReport*>(arg));
  return nullptr;
}

// One frame holding `json` (n bytes).
void write_frame(int fd, const char* json, size_t n) {
  Pages buf(4 + n);
  char* frame = buf.get();
  if (!frame) return;
  put_len(frame, static_cast<uint32_t>(n));
  memcpy(frame + 4, json, n);
  put_all(fd, frame, 4 + n);
}

// `s` as a JSON string at buf[at] (the caller sized buf for 6 bytes a character and quotes).
size_t append_json_string(char* buf, size_t at, const char* s) {
  static const char hex[] = "0123456789abcdef";
  buf[at++] = '"';
  for (; *s; ++s) {
    const auto c = static_cast<unsigned char>(*s);
    if (c == '"' || c == '\\') {
      buf[at++] = '\\';
      buf[at++] = static_cast<char>(c);
    } else if (c < 0x20) {
      at = append(buf, at, "\\u00");
      buf[at++] = hex[c >> 4];
      buf[at++] = hex[c & 15];
    } else {
      buf[at++] = static_cast<char>(c);
    }
  }
  buf[at++] = '"';
  return at;
}

}  // namespace

void report_exit() {
  const int fd = evidence_fd_now();
  const umbp_sim_kernel* k = g_kernel.load(std::memory_order_acquire);
  if (fd < 0 || !k || g_dying.load()) return;
  char head[512];
  size_t nh = append_open(head, 0);
  nh = append(head, nh, "\"event\": \"exit\", \"pid\": ");
  nh = append_number(head, nh, static_cast<unsigned long>(::getpid()));
  nh = append_stats(head, nh);
  nh = append(head, nh, ", \"kernel\": ");
  write_frame_with_postmortem(fd, k, head, nh);
}

void report_setup_error(const char* text) {
  const int fd = evidence_fd_now();
  if (fd < 0) {
    put("umbp-sim exec: ");
    put(text);
    put("\n");
    return;
  }
  const size_t n = strlen(text);
  Pages buf(128 + 6 * n);
  char* json = buf.get();
  if (!json) return;
  size_t at = append_open(json, 0);
  at = append(json, at, "\"event\": \"error\", \"pid\": ");
  at = append_number(json, at, static_cast<unsigned long>(::getpid()));
  at = append(json, at, ", \"text\": ");
  at = append_json_string(json, at, text);
  json[at++] = '}';
  write_frame(fd, json, at);
}

void set_evidence_fd(int fd) {
  struct stat st;
  if (fd >= 0 && fstat(fd, &st) == 0) {
    g_evidence_dev = st.st_dev;
    g_evidence_ino = st.st_ino;
  } else {
    fd = kNoFd;
  }
  g_evidence_fd.store(fd);
}

void keep_evidence_fd_in_forks() { g_keep_in_forks.store(true); }

void set_evidence_token(const char* hex) {
  size_t n = 0;
  for (; hex[n] && n + 1 < sizeof g_token; ++n) {
    const char c = hex[n];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) break;  // hex only: no escaping
    g_token[n] = c;
  }
  g_token[n] = '\0';
}

void forget_evidence_fd_in_fork_child() {
  if (g_keep_in_forks.load()) return;  // exec mode: each process's frames name it (pid)
  const int fd = g_evidence_fd.load();
  if (fd < 0) return;
  sys_close(fd);
  g_evidence_fd.store(kForked);
}

[[noreturn]] void die_of(const umbp_sim_kernel* k, int sig, const char* stage) {
  if (g_dying.exchange(true)) {
    for (;;) pause();  // another thread is reporting its death: the process ends with it
  }
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
    real_sigaction(SIGSEGV, &g_old_segv, nullptr);
  }
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  sigprocmask(SIG_UNBLOCK, &set, nullptr);
  raise(sig);  // the previous handler (faulthandler) runs and re-raises, or the default kills
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  real_sigaction(sig, &dfl, nullptr);
  raise(sig);
  _exit(128 + sig);
}

int fail(const umbp_sim_kernel* k, const umbp_sim_result& r, const char* stage) {
  if (r.signal) die_of(k, r.signal, stage);
  errno = r.error;
  return -1;
}

}  // namespace umbp_interpose
