/* A multi-threaded program for tests/external/test_exec_threads.py, run under `umbp-sim exec`:
 * THREADS threads, started together, each doing ITERATIONS times: map 2 MiB, write one byte
 * (the page fault the interposer hands to the simulated host), read it back, unmap. KIND says
 * what is mapped:
 *   hugetlb  anonymous MAP_HUGETLB (2 MiB pages)
 *   anon     anonymous base pages
 *   memfd    a MFD_HUGETLB memfd: memfd_create, ftruncate, mmap MAP_SHARED, close, then the
 *            write and the munmap
 * PATH (uffd or sigsegv) is the fault path the interposer must be on (its control API, found
 * with dlsym: the program links nothing of umbp-sim). Prints nothing and exits 0 when every call
 * succeeded; otherwise one line on stderr and exit 1 (a call failed: the thread, iteration and
 * step), 2 (bad arguments) or 3 (not on that fault path). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "umbp_sim/interposer.h"

#ifndef MAP_HUGE_SHIFT
#define MAP_HUGE_SHIFT 26
#endif
#ifndef MFD_HUGETLB
#define MFD_HUGETLB 0x0004U
#endif
#ifndef MFD_HUGE_SHIFT
#define MFD_HUGE_SHIFT 26
#endif

#define SIZE ((size_t)2 << 20)

enum kind { HUGETLB, ANON, MEMFD };

static enum kind g_kind;
static long g_iterations;
static pthread_barrier_t g_start;

static void fail(long thread, long i, const char* step) {
  fprintf(stderr, "thread %ld iteration %ld: %s: %s\n", thread, i, step, strerror(errno));
  exit(1);
}

static void* worker(void* arg) {
  const long thread = (long)arg;
  pthread_barrier_wait(&g_start);
  for (long i = 0; i < g_iterations; ++i) {
    void* p;
    if (g_kind == MEMFD) {
      const int fd = memfd_create("exec_threads", MFD_HUGETLB | (21U << MFD_HUGE_SHIFT));
      if (fd < 0) fail(thread, i, "memfd_create");
      if (ftruncate(fd, (off_t)SIZE) != 0) fail(thread, i, "ftruncate");
      p = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) fail(thread, i, "mmap");
      if (close(fd) != 0) fail(thread, i, "close");
    } else {
      int flags = MAP_PRIVATE | MAP_ANONYMOUS;
      if (g_kind == HUGETLB) flags |= MAP_HUGETLB | (21 << MAP_HUGE_SHIFT);
      p = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, flags, -1, 0);
      if (p == MAP_FAILED) fail(thread, i, "mmap");
    }
    volatile unsigned char* byte = (volatile unsigned char*)p + (size_t)(i % 512) * 4096;
    const unsigned char want = (unsigned char)(1 + (thread * 31 + i) % 255);
    *byte = want;
    if (*byte != want) {
      errno = EIO;
      fail(thread, i, "read back");
    }
    if (munmap(p, SIZE) != 0) fail(thread, i, "munmap");
  }
  return NULL;
}

// 0 when the interposer is on the fault path named `want`, else 3 with the line.
static int check_fault_path(const char* want) {
  const int expected = strcmp(want, "uffd") == 0      ? UMBP_SIM_FAULT_PATH_UFFD
                       : strcmp(want, "sigsegv") == 0 ? UMBP_SIM_FAULT_PATH_SIGSEGV
                                                      : -1;
  int (*fault_path)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "umbp_sim_interposer_fault_path");
  const int got = fault_path ? fault_path() : -1;
  if (expected < 0 || got != expected) {
    fprintf(stderr, "fault path %d, not %s (%d)\n", got, want, expected);
    return 3;
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s hugetlb|anon|memfd THREADS ITERATIONS uffd|sigsegv\n", argv[0]);
    return 2;
  }
  if (check_fault_path(argv[4]) != 0) return 3;
  if (strcmp(argv[1], "hugetlb") == 0) {
    g_kind = HUGETLB;
  } else if (strcmp(argv[1], "anon") == 0) {
    g_kind = ANON;
  } else if (strcmp(argv[1], "memfd") == 0) {
    g_kind = MEMFD;
  } else {
    fprintf(stderr, "%s: unknown kind %s\n", argv[0], argv[1]);
    return 2;
  }
  const long threads = strtol(argv[2], NULL, 10);
  g_iterations = strtol(argv[3], NULL, 10);
  if (threads < 1 || threads > 64 || g_iterations < 1) {
    fprintf(stderr, "%s: THREADS in 1..64, ITERATIONS at least 1\n", argv[0]);
    return 2;
  }
  pthread_t tids[64];
  pthread_barrier_init(&g_start, NULL, (unsigned)threads);
  for (long t = 0; t < threads; ++t) {
    const int err = pthread_create(&tids[t], NULL, worker, (void*)t);
    if (err != 0) {
      errno = err;
      fail(t, 0, "pthread_create");
    }
  }
  for (long t = 0; t < threads; ++t) pthread_join(tids[t], NULL);
  return 0;
}
