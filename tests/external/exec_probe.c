/* A program for tests/external/test_exec.py, run under `umbp-sim exec`: a 2 MiB MAP_HUGETLB
 * mapping bound to node 1 (mbind, MPOL_BIND) and touched, as an allocator with a NUMA node asks
 * for one. It prints what it got, one "key: value" line a step, and what it sees of the host:
 * the node directories, HugePages_Free, the node move_pages(2) says the page is on. Exit 0, or
 * 2 (mmap failed), 3 (mbind failed). A simulated SIGBUS ends it in the touch. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef MAP_HUGE_SHIFT
#define MAP_HUGE_SHIFT 26
#endif
#define MPOL_BIND 2

static const char* errno_name(int e) {
  switch (e) {
    case EIO:
      return "EIO";
    case ENOMEM:
      return "ENOMEM";
    case EINVAL:
      return "EINVAL";
    case EFAULT:
      return "EFAULT";
    case EPERM:
      return "EPERM";
    default:
      return "another errno";
  }
}

static void nodes(void) {
  DIR* d = opendir("/sys/devices/system/node");
  int n = 0;
  if (d) {
    struct dirent* e;
    while ((e = readdir(d)) != NULL)
      if (strncmp(e->d_name, "node", 4) == 0 && e->d_name[4] >= '0' && e->d_name[4] <= '9') ++n;
    closedir(d);
  }
  printf("nodes: %d\n", n);
}

static void hugepages_free(void) {
  FILE* f = fopen("/proc/meminfo", "r");
  char line[256];
  if (!f) return;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, "HugePages_Free:", 15) == 0) printf("HugePages_Free: %ld\n", atol(line + 15));
  fclose(f);
}

int main(void) {
  const size_t len = (size_t)2 << 20;
  nodes();
  printf("page size: %ld\n", sysconf(_SC_PAGESIZE));
  void* p = mmap(NULL, len, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | (21 << MAP_HUGE_SHIFT), -1, 0);
  if (p == MAP_FAILED) {
    printf("mmap: %s\n", errno_name(errno));
    return 2;
  }
  printf("mmap: ok\n");
  unsigned long mask = 1ul << 1;
  if (syscall(SYS_mbind, p, len, MPOL_BIND, &mask, 64, 0) != 0) {
    printf("mbind: %s\n", errno_name(errno));
    return 3;
  }
  printf("mbind: ok\n");
  fflush(stdout);
  memset(p, 0x5a, len);
  printf("touch: ok\n");
  void* pages[1] = {p};
  int status[1] = {-1};
  if (syscall(SYS_move_pages, 0, 1, pages, NULL, status, 0) == 0)
    printf("page node: %d\n", status[0]);
  hugepages_free();
  munmap(p, len);
  return 0;
}
