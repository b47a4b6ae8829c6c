// umbp-sim's Python binding of mori's HostMemAllocator, for `umbp-sim build-allocator --mori
// CHECKOUT`: the surface mori's own pybind module gives the allocator (UMBPHostBufferBacking,
// UMBPHostBufferHandle, UMBPHostMemAllocator with alloc() and free(), their defaults and
// argument names), written against the public header src/umbp/include/umbp/local/
// host_mem_allocator.h alone, so a checkout builds without the rest of mori's Python module
// (its distributed client, gRPC, HIP). Where the header declares mori's C++-only shm registry,
// the module also has it as _umbp_sim_* functions (umbp-sim's acquire/lookup/release steps).
// The module is named by UMBP_SIM_MODULE_NAME (the output file's stem).
#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <type_traits>
#include <utility>

#include "umbp/local/host_mem_allocator.h"

#ifndef UMBP_SIM_MODULE_NAME
#define UMBP_SIM_MODULE_NAME mori_umbp
#endif

namespace py = pybind11;
using mori::umbp::HostBufferBacking;
using mori::umbp::HostBufferHandle;
using mori::umbp::HostBufferOptions;
using mori::umbp::HostMemAllocator;

namespace {

// mori's shm registry (LookupShmAllocation, AcquireShmAllocation, ReleaseShmAllocation: static,
// C++ only) where the checkout's header declares it; an older header builds without it.
template <typename A, typename = void>
struct HasShmRegistry : std::false_type {};
template <typename A>
struct HasShmRegistry<A, std::void_t<decltype(A::LookupShmAllocation(uintptr_t{}, size_t{})),
                                     decltype(A::AcquireShmAllocation(uintptr_t{}, size_t{})),
                                     decltype(A::ReleaseShmAllocation(uintptr_t{}))>>
    : std::true_type {};

// An allocation as (base, mapped_size, fd), or None.
template <typename Found>
py::object ShmToPy(const Found& found) {
  if (!found) return py::none();
  return py::make_tuple(reinterpret_cast<uintptr_t>(found->base), found->mapped_size, found->fd);
}

// A registry search (Lookup or Acquire: the same arguments and answer), without the GIL.
template <auto Find>
py::object FindShm(uintptr_t ptr, size_t size) {
  auto found = [&] {
    py::gil_scoped_release unlocked;
    return Find(ptr, size);
  }();
  return ShmToPy(found);
}

// The registry as module functions for umbp-sim's acquire/lookup/release steps, named so they
// cannot be taken for mori's own Python surface (which has none of them).
template <typename A>
void DefShmRegistry(py::module_& m) {
  if constexpr (HasShmRegistry<A>::value) {
    m.def("_umbp_sim_lookup_shm_allocation", &FindShm<&A::LookupShmAllocation>, py::arg("ptr"),
          py::arg("size"));
    m.def("_umbp_sim_acquire_shm_allocation", &FindShm<&A::AcquireShmAllocation>, py::arg("ptr"),
          py::arg("size"));
    m.def(
        "_umbp_sim_release_shm_allocation", [](uintptr_t base) { A::ReleaseShmAllocation(base); },
        py::arg("base"), py::call_guard<py::gil_scoped_release>());
  }
}

}  // namespace

PYBIND11_MODULE(UMBP_SIM_MODULE_NAME, m) {
  py::enum_<HostBufferBacking>(m, "UMBPHostBufferBacking")
      .value("Anonymous", HostBufferBacking::kAnonymous)
      .value("AnonymousHugetlb", HostBufferBacking::kAnonymousHugetlb)
      .value("AnonymousShm", HostBufferBacking::kAnonymousShm)
      .value("AnonymousShmHugetlb", HostBufferBacking::kAnonymousShmHugetlb)
      .export_values();

  py::class_<HostBufferHandle>(m, "UMBPHostBufferHandle")
      .def(py::init<>())
      .def_property_readonly(
          "ptr", [](const HostBufferHandle& h) { return reinterpret_cast<uintptr_t>(h.ptr); })
      .def_readonly("requested_size", &HostBufferHandle::requested_size)
      .def_readonly("mapped_size", &HostBufferHandle::mapped_size)
      .def_readonly("actual_backing", &HostBufferHandle::actual_backing)
      .def_readonly("actual_alignment", &HostBufferHandle::actual_alignment)
      .def("__bool__", &HostBufferHandle::valid)
      .def("__repr__", [](const HostBufferHandle& h) {
        std::ostringstream out;
        out << "<UMBPHostBufferHandle ptr=0x" << std::hex << reinterpret_cast<uintptr_t>(h.ptr)
            << std::dec << " requested_size=" << h.requested_size
            << " mapped_size=" << h.mapped_size << ">";
        return out.str();
      });

  py::class_<HostMemAllocator>(m, "UMBPHostMemAllocator")
      .def(py::init<>())
      .def(
          "alloc",
          [](HostMemAllocator& self, size_t size, HostBufferBacking backing, size_t hugepage_size,
             int numa_node, bool prefault) {
            HostBufferOptions opts;
            opts.backing = backing;
            opts.hugepage_size = hugepage_size;
            opts.numa_node = numa_node;
            opts.prefault = prefault;
            return self.Alloc(size, opts);
          },
          py::arg("size"), py::arg("backing") = HostBufferBacking::kAnonymous,
          py::arg("hugepage_size") = size_t{2} << 20, py::arg("numa_node") = -1,
          py::arg("prefault") = true, py::call_guard<py::gil_scoped_release>())
      .def(
          "free", [](HostMemAllocator& self, HostBufferHandle& handle) { self.Free(handle); },
          py::arg("handle"), py::call_guard<py::gil_scoped_release>());

  DefShmRegistry<HostMemAllocator>(m);
}
