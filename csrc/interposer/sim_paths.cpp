// The simulated host's /proc and /sys for a program `umbp-sim exec` started (exec_mode.cpp):
// which paths it answers, and opens and directory listings of them.
//
// umbp-sim renders the host's files into the run's private directory (`<dir>/root/proc/meminfo`,
// ...): that tree says which paths the simulated host has and lists its directories (opendir of
// /sys/devices/system/node lists its nodes, not this box's). A file's contents come from the
// Kernel when opened (its counters now), else from the rendered copy (the process limits and
// cgroup files are fixed). Two trees are the simulated host's alone: /sys/devices/system/node and
// /sys/kernel/mm/hugepages (its nodes and hugepage sizes): a path there that it does not have is
// ENOENT, never this box's file. Any other path it does not render is this box's (/proc/self/maps,
// /proc/cpuinfo, /sys/devices/system/cpu/online).
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>

#include "interposer/interposer_internal.h"

namespace umbp_interpose {

namespace {

char g_root[PATH_MAX] = "";  // <dir>/root; empty: not a program umbp-sim exec started
size_t g_root_len = 0;

constexpr const char* kOwnedTrees[] = {"/sys/devices/system/node", "/sys/kernel/mm/hugepages"};

bool starts_with(const char* s, const char* prefix) {
  return strncmp(s, prefix, strlen(prefix)) == 0;
}

// `root + path` without trailing slashes into out; false if it does not fit.
bool rooted(const char* path, char* out, size_t cap) {
  size_t n = strlen(path);
  while (n > 1 && path[n - 1] == '/') --n;
  if (g_root_len + n + 1 > cap) return false;
  memcpy(out, g_root, g_root_len);
  memcpy(out + g_root_len, path, n);
  out[g_root_len + n] = '\0';
  return true;
}

// 0: missing, S_IFREG or S_IFDIR (raw: stat is not ours, but keep clear of any interposer).
unsigned kind_of(const char* real_path) {
  struct stat st {};
  if (raw(SYS_newfstatat, AT_FDCWD, L(real_path), L(&st), 0) != 0) return 0;
  return st.st_mode & S_IFMT;
}

bool in_owned_tree(const char* path) {
  for (const char* tree : kOwnedTrees) {
    const size_t n = strlen(tree);
    if (strncmp(path, tree, n) == 0 && (path[n] == '\0' || path[n] == '/')) return true;
  }
  return false;
}

}  // namespace

void set_sim_root(const char* root) {
  const size_t n = strlen(root);
  if (n + 1 > sizeof g_root) return;
  memcpy(g_root, root, n + 1);
  g_root_len = n;
}

bool have_sim_root() { return g_root_len > 0; }

PathKind sim_path_kind(const char* path, char* rendered, size_t cap) {
  if (!g_root_len || !path || !(starts_with(path, "/proc/") || starts_with(path, "/sys/")))
    return PathKind::Real;
  if (!rooted(path, rendered, cap)) return PathKind::Real;
  const unsigned kind = kind_of(rendered);
  if (kind == S_IFREG) return PathKind::File;
  if (kind == S_IFDIR) return PathKind::Directory;
  return in_owned_tree(path) ? PathKind::Missing : PathKind::Real;
}

int open_sim_path(const umbp_sim_kernel* k, const char* path, int flags, int mode, bool* answered) {
  char rendered[PATH_MAX];
  *answered = true;
  switch (sim_path_kind(path, rendered, sizeof rendered)) {
    case PathKind::File: {
      const int fd = open_rendered(k, path);
      if (fd >= 0 || errno != ENOENT) return fd;
      // Not the Kernel's: the rendered copy (process limits, cgroup files), read-only.
      return static_cast<int>(
          raw(SYS_openat, AT_FDCWD, L(rendered), O_RDONLY | (flags & O_CLOEXEC), mode));
    }
    case PathKind::Directory:
      return static_cast<int>(raw(SYS_openat, AT_FDCWD, L(rendered), flags, mode));
    case PathKind::Missing:
      errno = ENOENT;
      return -1;
    case PathKind::Real:
      break;
  }
  *answered = false;
  return -1;
}

FILE* fopen_sim_path(const umbp_sim_kernel* k, const char* path, const char* mode, bool* answered) {
  const int fd = open_sim_path(k, path, O_RDONLY | O_CLOEXEC, 0, answered);
  if (!*answered || fd < 0) return nullptr;
  FILE* f = fdopen(fd, mode && mode[0] ? mode : "r");
  if (!f) sys_close(fd);
  return f;
}

DIR* opendir_sim_path(const char* path, DIR* (*real_opendir)(const char*), bool* answered) {
  char rendered[PATH_MAX];
  *answered = true;
  switch (sim_path_kind(path, rendered, sizeof rendered)) {
    case PathKind::File:
    case PathKind::Directory:
      return real_opendir(rendered);
    case PathKind::Missing:
      errno = ENOENT;
      return nullptr;
    case PathKind::Real:
      break;
  }
  *answered = false;
  return nullptr;
}

}  // namespace umbp_interpose
