/* Calls every function of the C ABI (umbp_sim/kernel.h) on a kernel handed over as a capsule's
 * pointer and reports "name value error signal" lines, for tests/external/test_capi.py. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "umbp_sim/kernel.h"

#define MPOL_BIND_ 2
#define MAP_HUGE_2MB_ (21 << 26)

static size_t put(char* out, size_t cap, size_t n, const char* name, umbp_sim_result r) {
  int w = snprintf(out + n, n < cap ? cap - n : 0, "%s %ld %d %d\n", name, r.value, r.error,
                   r.signal);
  return n + (w > 0 ? (size_t)w : 0);
}

int probe(const umbp_sim_kernel* k, char* out, size_t cap) {
  size_t n = 0;
  umbp_sim_result r = {(long)umbp_sim_page_size(k), 0, 0};
  n = put(out, cap, n, "page_size", r);
  r.value = (long)k->ops->flags;
  n = put(out, cap, n, "flags", r);
  const size_t len = 4u << 20;
  umbp_sim_result m = umbp_sim_mmap(k, NULL, len, PROT_READ | PROT_WRITE,
                                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | MAP_HUGE_2MB_, -1,
                                    0);
  n = put(out, cap, n, "mmap", m);
  void* a = (void*)m.value;
  const unsigned long end = k->ops->mapping_end(k->self, a);
  r.value = end ? (long)(end - (unsigned long)m.value) : 0;
  n = put(out, cap, n, "mapping_length", r);
  unsigned long mask[2] = {1ul << 1, 0};
  n = put(out, cap, n, "mbind_node1_maxnode3", umbp_sim_mbind(k, a, len, MPOL_BIND_, mask, 3, 0));
  n = put(out, cap, n, "mbind_node1_maxnode1", umbp_sim_mbind(k, a, len, MPOL_BIND_, mask, 1, 0));
  mask[0] = 1ul << 63;
  n = put(out, cap, n, "mbind_node63_maxnode64", umbp_sim_mbind(k, a, len, MPOL_BIND_, mask, 64, 0));
  char* data = NULL;
  r = umbp_sim_read_file(k, "/proc/meminfo", &data);
  r.error = r.error ? r.error : (data && strstr(data, "HugePages_Total:") ? 0 : -1);
  n = put(out, cap, n, "read_meminfo", r);
  free(data);
  n = put(out, cap, n, "read_missing", umbp_sim_read_file(k, "/proc/nope", &data));
  umbp_sim_result fd = umbp_sim_memfd_create(k, "probe", 1u /* MFD_CLOEXEC */);
  n = put(out, cap, n, "memfd_create", fd);
  n = put(out, cap, n, "ftruncate", umbp_sim_ftruncate(k, (int)fd.value, 1 << 20));
  n = put(out, cap, n, "close", umbp_sim_close(k, (int)fd.value));
  n = put(out, cap, n, "close_again", umbp_sim_close(k, (int)fd.value));
  n = put(out, cap, n, "madvise_populate", umbp_sim_madvise(k, a, len, 23));
  if (m.error == 0) n = put(out, cap, n, "touch", umbp_sim_touch(k, a, len, 2u << 20));
  char crash[256];
  r.value = (long)k->ops->describe(k->self, 0, crash, sizeof crash);
  n = put(out, cap, n, "crash_text_length", r);
  int w = snprintf(out + n, n < cap ? cap - n : 0, "crash %s\n", crash);
  n += w > 0 ? (size_t)w : 0;
  /* SimKernel's reasons as JSON lines, on one line (newlines as \x1f). */
  char reasons[4096];
  r.value = (long)k->ops->describe(k->self, 2, reasons, sizeof reasons);
  n = put(out, cap, n, "reasons_length", r);
  for (char* c = reasons; *c; ++c)
    if (*c == '\n') *c = '\x1f';
  w = snprintf(out + n, n < cap ? cap - n : 0, "reasons %s\n", reasons);
  n += w > 0 ? (size_t)w : 0;
  if (m.error == 0) n = put(out, cap, n, "munmap", umbp_sim_munmap(k, a, len));
  return (int)n;
}
