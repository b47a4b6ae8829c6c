// A small host-memory allocator written for umbp-sim's tests of external allocators: plain libc
// calls (mmap, madvise, syscall(SYS_mbind), memfd_create, ftruncate, close, sysconf,
// std::ifstream of /proc/meminfo) and mori.umbp's Python surface. It is NOT mori: it is
// independent code whose behaviour differs from umbp-sim's built-in allocator on purpose:
//   - a failed MADV_POPULATE_WRITE falls back to touching every page by hand (SIGBUS when the
//     hugetlb pool is empty), never demotes after mapping;
//   - the NUMA mask has node/64+1 words and maxnode = 64 * words (node 63 is never bound);
//   - every hugetlb fallback warns, with the default pool's counters from /proc/meminfo.
// Planted variants (compiled with -D, tests/external/conftest.py tiny_planted):
//   - TINY_WRONG_NODE: binds to the other node of a pair (numa_node ^ 1), the bug of an
//     allocator change that compare reports in its "numa binding" class;
//   - TINY_ENV_PROBE: reads MORI_UMBP_LOG_LEVEL at alloc time (getenv) and, when set, warns
//     what it saw;
//   - TINY_STRIDE_BUG: touches by hand with the hugepage size as the stride on base pages too
//     (only kernels before 5.14 touch by hand), the bug compare reports in its "faulted" class;
//   - TINY_FREE_KEEPS_HANDLE: a free whose munmap fails returns with the handle still valid,
//     the bug compare reports in its "after free" class;
//   - TINY_NO_OVERFLOW_CHECK: rounds the size up without checking it fits in size_t (a size
//     near 2^64 wraps to a small one): "warning count", with the quick matrix's top sizes;
//   - TINY_SIZE_32: encodes the hugepage size in the flags from its low 32 bits (16 GiB pages
//     become the default size): "backing", on the quick matrix's ppc64le 16 GiB host;
//   - TINY_REQUESTED_ROUNDED: the handle's requested_size is the rounded size: "requested_size";
//   - TINY_POPULATE_READ: prefaults with MADV_POPULATE_READ (private anonymous memory then maps
//     the zero page and nothing is faulted): "faulted";
//   - TINY_SHM_PRIVATE: maps the memfd MAP_PRIVATE (its writes never reach the fd): "mapping";
//   - TINY_NO_CLOEXEC: creates the memfd without MFD_CLOEXEC (every program the process execs
//     inherits it): "mapping";
//   - TINY_OFFSET_32: touches by hand with a 32-bit offset, which wraps at 4 GiB: a buffer past
//     4 GiB is touched forever (kernels before 5.14), the quick matrix's field-sized runs time
//     out: "outcome".
//   - TINY_MBIND_ERROR_LEVEL: the mbind failure's line is said at [error], not [warning]: the
//     same text at another level ("log level").
//   - TINY_LEAK_FD: when the memfd's mmap fails (an empty hugetlb pool) the fd is not closed:
//     "leak", compare naming the memfd_create line below as the call that made it.
#include <fcntl.h>
#include <linux/mempolicy.h>
#include <pybind11/pybind11.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace py = pybind11;

namespace tiny {

enum class Backing { Anonymous, AnonymousHugetlb, AnonymousShm, AnonymousShmHugetlb };

struct Handle {
  uintptr_t ptr = 0;
  size_t requested_size = 0;
  size_t mapped_size = 0;
  Backing actual_backing = Backing::Anonymous;
  size_t actual_alignment = 0;
  int fd = -1;
  bool valid() const { return ptr != 0; }
};

void warn(const std::string& text) { std::fprintf(stderr, "tiny [warning] %s\n", text.c_str()); }

bool pow2(size_t v) { return v && !(v & (v - 1)); }

int log2_of(size_t v) {
#ifdef TINY_SIZE_32
  v = static_cast<uint32_t>(v);
#endif
  int n = 0;
  while (v > 1) {
    v >>= 1;
    ++n;
  }
  return n;
}

std::string meminfo_summary() {
  std::ifstream in("/proc/meminfo");
  if (!in.is_open()) return "meminfo unreadable";
  std::string line, out;
  while (std::getline(in, line))
    if (line.rfind("HugePages_Total:", 0) == 0 || line.rfind("HugePages_Free:", 0) == 0)
      out += (out.empty() ? "" : " ") + line;
  return out;
}

void touch_pages(void* p, size_t n, size_t stride) {
  volatile char* b = static_cast<volatile char*>(p);
#ifdef TINY_OFFSET_32
  for (uint32_t off = 0; off < n; off += static_cast<uint32_t>(stride)) b[off] = 1;
#else
  for (size_t off = 0; off < n; off += stride) b[off] = 1;
#endif
}

class Allocator {
 public:
  Handle alloc(size_t size, Backing backing, size_t hugepage_size, int numa_node, bool prefault) {
    Handle h;
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    if (size == 0) return h;
    const bool huge =
        backing == Backing::AnonymousHugetlb || backing == Backing::AnonymousShmHugetlb;
    const bool shm = backing == Backing::AnonymousShm || backing == Backing::AnonymousShmHugetlb;
    if (huge && !pow2(hugepage_size)) return h;
    size_t align = huge ? hugepage_size : page;
#ifndef TINY_NO_OVERFLOW_CHECK
    if (size > SIZE_MAX - align) return h;
#endif
    size_t len = (size + align - 1) / align * align;
    void* p = MAP_FAILED;
    int fd = -1;
    if (shm) {
#ifdef TINY_NO_CLOEXEC
      unsigned flags = 0;
#else
      unsigned flags = MFD_CLOEXEC;
#endif
      if (huge) flags |= MFD_HUGETLB | (static_cast<unsigned>(log2_of(hugepage_size)) << 26);
      fd = memfd_create("tiny", flags);
      if (fd >= 0 && ftruncate(fd, static_cast<off_t>(len)) == 0)
#ifdef TINY_SHM_PRIVATE
        p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
#else
        p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
#endif
      if (p == MAP_FAILED && fd >= 0) {
#ifndef TINY_LEAK_FD
        close(fd);
#endif
        fd = -1;
      }
    } else {
      int flags = MAP_PRIVATE | MAP_ANONYMOUS;
      if (huge) flags |= MAP_HUGETLB | (log2_of(hugepage_size) << 26);
      p = mmap(nullptr, len, PROT_READ | PROT_WRITE, flags, -1, 0);
    }
    if (p == MAP_FAILED && huge) {
      warn("hugetlb failed for size=" + std::to_string(size) + " (" + std::strerror(errno) +
           "); using 4 KiB pages. " + meminfo_summary());
      return alloc(size, shm ? Backing::AnonymousShm : Backing::Anonymous, hugepage_size, numa_node,
                   prefault);
    }
    if (p == MAP_FAILED) return h;
#ifdef TINY_ENV_PROBE
    if (const char* level = std::getenv("MORI_UMBP_LOG_LEVEL"))
      warn(std::string("MORI_UMBP_LOG_LEVEL=") + level + " at alloc");
#endif
#ifdef TINY_WRONG_NODE
    if (numa_node >= 0) numa_node ^= 1;
#endif
    if (numa_node >= 0) {
      std::vector<unsigned long> mask(static_cast<size_t>(numa_node) / 64 + 1, 0UL);
      mask[static_cast<size_t>(numa_node) / 64] |= 1UL << (numa_node % 64);
      long rc = syscall(SYS_mbind, p, len, MPOL_BIND, mask.data(), mask.size() * 64, 0);
      if (rc != 0) {
#ifdef TINY_MBIND_ERROR_LEVEL
        std::fprintf(stderr, "tiny [error] %s\n",
                     ("mbind(node=" + std::to_string(numa_node) + ") failed: " +
                      std::strerror(errno)).c_str());
#else
        warn("mbind(node=" + std::to_string(numa_node) + ") failed: " + std::strerror(errno));
#endif
      }
    }
#ifdef TINY_POPULATE_READ
    const int populate = 22;  // MADV_POPULATE_READ
#else
    const int populate = 23;  // MADV_POPULATE_WRITE
#endif
    if (prefault && madvise(p, len, populate) != 0) {
      warn(std::string("populate failed (") + std::strerror(errno) + "); touching pages");
#ifdef TINY_STRIDE_BUG
      touch_pages(p, len, hugepage_size);
#else
      touch_pages(p, len, huge ? hugepage_size : page);
#endif
    }
    h.ptr = reinterpret_cast<uintptr_t>(p);
#ifdef TINY_REQUESTED_ROUNDED
    h.requested_size = len;
#else
    h.requested_size = size;
#endif
    h.mapped_size = len;
    h.actual_backing = backing;
    h.actual_alignment = align;
    h.fd = fd;
    return h;
  }

  void free(Handle& h) {
    if (!h.valid()) return;
    if (munmap(reinterpret_cast<void*>(h.ptr), h.mapped_size) != 0) {
      warn(std::string("munmap failed: ") + std::strerror(errno));
#ifdef TINY_FREE_KEEPS_HANDLE
      return;
#endif
    }
    if (h.fd >= 0) close(h.fd);
    // As mori's Free: the address, sizes and fd cleared, the backing and alignment kept.
    h.ptr = 0;
    h.requested_size = 0;
    h.mapped_size = 0;
    h.fd = -1;
  }
};

}  // namespace tiny

PYBIND11_MODULE(TINY_MODULE_NAME, m) {
  using tiny::Backing;
  py::enum_<Backing>(m, "UMBPHostBufferBacking")
      .value("Anonymous", Backing::Anonymous)
      .value("AnonymousHugetlb", Backing::AnonymousHugetlb)
      .value("AnonymousShm", Backing::AnonymousShm)
      .value("AnonymousShmHugetlb", Backing::AnonymousShmHugetlb);
  py::class_<tiny::Handle>(m, "UMBPHostBufferHandle")
      .def_readonly("ptr", &tiny::Handle::ptr)
      .def_readonly("requested_size", &tiny::Handle::requested_size)
      .def_readonly("mapped_size", &tiny::Handle::mapped_size)
      .def_readonly("actual_backing", &tiny::Handle::actual_backing)
      .def_readonly("actual_alignment", &tiny::Handle::actual_alignment)
      .def("__bool__", &tiny::Handle::valid);
  py::class_<tiny::Allocator>(m, "UMBPHostMemAllocator")
      .def(py::init<>())
      .def("alloc", &tiny::Allocator::alloc, py::arg("size"),
           py::arg("backing") = Backing::Anonymous, py::arg("hugepage_size") = 2097152,
           py::arg("numa_node") = -1, py::arg("prefault") = true)
      .def("free", &tiny::Allocator::free, py::arg("handle"));
}
