// The Kernel seam as seen from Python: raw calls with Linux's results and errno, so tests can
// drive LinuxKernel and SimKernel with the same operation sequence and compare them.
#include <linux/memfd.h>
#include <linux/mempolicy.h>
#include <pybind11/stl.h>
#include <sys/mman.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <vector>

#include "kernel/kernel.h"
#include "kernel/syscall_format.h"
#include "python/bindings.h"
#include "python/native_call.h"

namespace py = pybind11;

namespace umbp::bindings {
namespace {

constexpr size_t kBitsPerLong = sizeof(unsigned long) * CHAR_BIT;

void* as_ptr(uintptr_t a) { return reinterpret_cast<void*>(a); }

}  // namespace

void bind_kernel(py::module_& m) {
  py::class_<SysResult>(m, "SysResult", "Result of one kernel call: value, errno, simulated signal")
      .def(py::init<>())
      .def_readonly("value", &SysResult::value)
      .def_readonly("error", &SysResult::error)
      .def_readonly("signal", &SysResult::signal)
      .def_property_readonly("ok", &SysResult::ok)
      .def_property_readonly("errno_name", [](const SysResult& r) { return errno_symbol(r.error); })
      .def("__repr__", [](const SysResult& r) {
        if (r.signal) return "<SysResult signal=" + std::to_string(r.signal) + ">";
        if (r.error) return std::string("<SysResult -1 ") + errno_symbol(r.error) + ">";
        return "<SysResult " + std::to_string(r.value) + ">";
      });

  m.def("errno_name", &errno_symbol, py::arg("errno"), "Symbolic name of an errno value");

  py::class_<Kernel, KernelPtr>(m, "Kernel", "An implementation of the kernel seam")
      .def_property_readonly("id", &Kernel::id,
                             "which simulated process this is (unique, never reused)")
      .def("page_size", &Kernel::page_size)
      .def(
          "mmap",
          [](Kernel& k, uintptr_t addr, size_t length, int prot, int flags, int fd, long offset) {
            NativeCall nogil;
            return k.mmap(as_ptr(addr), length, prot, flags, fd, static_cast<off_t>(offset));
          },
          py::arg("addr"), py::arg("length"), py::arg("prot"), py::arg("flags"), py::arg("fd") = -1,
          py::arg("offset") = 0)
      .def(
          "munmap",
          [](Kernel& k, uintptr_t addr, size_t length) {
            NativeCall nogil;
            return k.munmap(as_ptr(addr), length);
          },
          py::arg("addr"), py::arg("length"))
      .def(
          "madvise",
          [](Kernel& k, uintptr_t addr, size_t length, int advice) {
            NativeCall nogil;
            return k.madvise(as_ptr(addr), length, advice);
          },
          py::arg("addr"), py::arg("length"), py::arg("advice"))
      .def(
          "mbind",
          // nodes=None passes a NULL mask; otherwise a mask with those bits, long enough for
          // both the highest node and maxnode bits (the kernel reads maxnode-1 bits).
          [](Kernel& k, uintptr_t addr, size_t length, int mode,
             std::optional<std::vector<unsigned>> nodes, unsigned long maxnode, unsigned flags) {
            std::vector<unsigned long> mask;
            if (nodes) {
              size_t bits = maxnode;
              for (unsigned n : *nodes) bits = std::max<size_t>(bits, size_t{n} + 1);
              if (bits > (1u << 20)) throw py::value_error("mbind: nodes/maxnode too large");
              mask.assign((bits + kBitsPerLong - 1) / kBitsPerLong + 1, 0UL);
              for (unsigned n : *nodes) mask[n / kBitsPerLong] |= 1UL << (n % kBitsPerLong);
            }
            NativeCall nogil;
            return k.mbind(as_ptr(addr), length, mode, nodes ? mask.data() : nullptr, maxnode,
                           flags);
          },
          py::arg("addr"), py::arg("length"), py::arg("mode"), py::arg("nodes"), py::arg("maxnode"),
          py::arg("flags") = 0)
      .def(
          "memfd_create",
          [](Kernel& k, const std::string& name, unsigned flags) {
            NativeCall nogil;
            return k.memfd_create(name.c_str(), flags);
          },
          py::arg("name"), py::arg("flags"))
      .def(
          "ftruncate",
          [](Kernel& k, int fd, long length) {
            NativeCall nogil;
            return k.ftruncate(fd, static_cast<off_t>(length));
          },
          py::arg("fd"), py::arg("length"))
      .def(
          "close",
          [](Kernel& k, int fd) {
            NativeCall nogil;
            return k.close(fd);
          },
          py::arg("fd"))
      .def(
          "read_file",
          // str on success; OSError(errno, strerror, path) as Python's open() would raise.
          [](Kernel& k, const std::string& path) {
            FileResult r;
            {
              NativeCall nogil;
              r = k.read_file(path);
            }
            if (!r.ok()) {
              PyErr_SetObject(PyExc_OSError,
                              py::make_tuple(r.error, std::strerror(r.error), path).ptr());
              throw py::error_already_set();
            }
            return r.data;
          },
          py::arg("path"))
      .def(
          "touch",
          [](Kernel& k, uintptr_t addr, size_t length, size_t stride) {
            NativeCall nogil;
            return k.touch(as_ptr(addr), length, stride);
          },
          py::arg("addr"), py::arg("length"), py::arg("stride"));

  // UAPI constants, so Python tests spell calls exactly as C does.
  py::dict c;
  // clang-format off
#define UMBP_C(name) c[#name] = static_cast<long>(name)
  UMBP_C(PROT_NONE); UMBP_C(PROT_READ); UMBP_C(PROT_WRITE); UMBP_C(MAP_SHARED); UMBP_C(MAP_PRIVATE);
  UMBP_C(MAP_FIXED); UMBP_C(MAP_ANONYMOUS); UMBP_C(MAP_NORESERVE); UMBP_C(MAP_POPULATE);
  UMBP_C(MAP_HUGETLB); UMBP_C(MADV_DONTNEED); UMBP_C(MPOL_DEFAULT); UMBP_C(MPOL_PREFERRED);
  UMBP_C(MPOL_BIND); UMBP_C(MPOL_INTERLEAVE); UMBP_C(MPOL_LOCAL); UMBP_C(MPOL_F_STATIC_NODES);
  UMBP_C(MPOL_F_RELATIVE_NODES); UMBP_C(MPOL_MF_STRICT); UMBP_C(MPOL_MF_MOVE);
  UMBP_C(MPOL_MF_MOVE_ALL); UMBP_C(MFD_CLOEXEC); UMBP_C(MFD_ALLOW_SEALING); UMBP_C(MFD_HUGETLB);
#undef UMBP_C
  // clang-format on
  // Not in every libc's headers: the kernel's values.
  c["MAP_HUGE_SHIFT"] = static_cast<long>(26);
  c["MAP_HUGE_MASK"] = static_cast<long>(0x3f);
  c["MADV_POPULATE_READ"] = static_cast<long>(22);
  c["MADV_POPULATE_WRITE"] = static_cast<long>(23);
  c["MFD_HUGE_SHIFT"] = static_cast<long>(26);
  m.attr("constants") = c;
}

}  // namespace umbp::bindings
