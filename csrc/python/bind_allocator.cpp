// The allocators as seen from Python: mori.umbp's UMBPHostBufferBacking / UMBPHostBufferHandle,
// and the raw built-in allocators (`UmbpSimAllocator`, `Mori624002cAllocator`, both a
// `HostMemAllocator`). A call that warned or met a simulated crash goes to the outcome hook
// (call_outcome.h). `warning_catalogue()` lists every warning's id and template.
#include <pybind11/stl.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "allocator/allocator_format.h"
#include "allocator/host_mem_allocator.h"
#include "allocator/mori_624002c_allocator.h"
#include "allocator/umbp_sim_allocator.h"
#include "allocator/warning_texts.h"
#include "kernel/crash_record.h"
#include "kernel/memory_lifetimes.h"
#include "python/bindings.h"
#include "python/call_outcome.h"
#include "python/handle_object.h"
#include "python/native_call.h"

namespace py = pybind11;

namespace umbp::bindings {
namespace {

// The handle's truth as the type's own nb_bool slot: `if not h` after every alloc then costs
// one C call, not the method lookup and dispatch a def("__bool__") would make it (Python adds
// the __bool__ wrapper from the slot).
int handle_bool(PyObject* self) {
  if (const HostBufferHandle* h = handle_value(self)) return h->valid() ? 1 : 0;
  try {
    return py::handle(self).cast<const HostBufferHandle&>().valid() ? 1 : 0;
  } catch (const py::cast_error& e) {
    PyErr_SetString(PyExc_TypeError, e.what());
    return -1;
  }
}

// One of the allocator's queries (made without the GIL) as a list, each record through to_dict.
template <typename Query, typename ToDict>
py::list records(Query&& query, ToDict&& to_dict) {
  decltype(query()) recs;
  {
    NativeCall nogil;
    recs = query();
  }
  py::list out;
  for (const auto& r : recs) out.append(to_dict(r));
  return out;
}

// A valid handle whose buffer's memory went with its simulated host (memory_lifetimes.h).
bool host_gone(const HostBufferHandle& h) { return h.valid() && memory_gone(h.kernel_id); }

// Using the address of such a handle: umbp_sim.errors.HostGoneError instead of a SIGSEGV.
[[noreturn]] void raise_host_gone(const HostBufferHandle& h, const char* what) {
  const std::string text =
      "UMBPHostBufferHandle(serial=" + std::to_string(h.serial) +
      ", requested_size=" + std::to_string(h.requested_size) + ")." + what +
      ": the simulated host this buffer was allocated on is gone (its SimKernel was destroyed, "
      "and the buffer's memory with it); keep the host, or an allocator on it, alive while the "
      "buffer is in use";
  py::object cls = py::module_::import("umbp_sim.errors").attr("HostGoneError");
  PyErr_SetString(cls.ptr(), text.c_str());
  throw py::error_already_set();
}

// One of the allocator's shm registry queries (made without the GIL): the allocation, or None.
template <typename Query>
py::object shm_query(Query&& query) {
  std::optional<HostMemAllocator::ShmAllocation> a;
  {
    NativeCall nogil;
    a = query();
  }
  if (!a) return py::none();
  return py::cast(*a);
}

}  // namespace

void bind_allocator(py::module_& m) {
  m.def(
      "set_outcome_hook", [](py::object hook) { outcome_hook() = std::move(hook); },
      py::arg("hook"),
      "fn(allocator, messages, signal, where), called after an allocator call that warned or "
      "crashed");
  m.def(
      "warning_catalogue",
      [] {
        py::list out;
        for (const texts::CatalogueEntry& e : texts::Catalogue())
          out.append(py::make_tuple(e.catalogue, e.warning->id, e.warning->text));
        return out;
      },
      "Every warning of the built-in allocators: [(catalogue, id, template)]");
  py::enum_<HostBufferBacking>(m, "UMBPHostBufferBacking", "Backing of a host buffer (mori.umbp)")
      .value("Anonymous", HostBufferBacking::Anonymous)
      .value("AnonymousHugetlb", HostBufferBacking::AnonymousHugetlb)
      .value("AnonymousShm", HostBufferBacking::AnonymousShm)
      .value("AnonymousShmHugetlb", HostBufferBacking::AnonymousShmHugetlb)
      .export_values();

  py::class_<HostBufferHandle>(
      m, "UMBPHostBufferHandle", "A host buffer (mori.umbp)",
      py::custom_type_setup([](PyHeapTypeObject* type) { type->as_number.nb_bool = handle_bool; }))
      .def(py::init<>())
      .def_property_readonly(
          "ptr",
          [](const HostBufferHandle& h) {
            if (host_gone(h)) raise_host_gone(h, "ptr");
            return reinterpret_cast<uintptr_t>(h.ptr);
          },
          "the buffer's address; umbp_sim.errors.HostGoneError once its simulated host is gone")
      .def_readonly("requested_size", &HostBufferHandle::requested_size)
      .def_readonly("mapped_size", &HostBufferHandle::mapped_size)
      .def_readonly("actual_backing", &HostBufferHandle::actual_backing)
      .def_readonly("actual_alignment", &HostBufferHandle::actual_alignment)
      .def_readonly("fd", &HostBufferHandle::fd, "memfd of Shm backings (owned), else -1")
      .def_readonly("numa_node", &HostBufferHandle::numa_node, "node bound by mbind, else -1")
      .def_readonly("serial", &HostBufferHandle::serial,
                    "which allocation (unique in this process; 0 once freed)")
      .def_readonly("kernel_id", &HostBufferHandle::kernel_id, "Kernel.id of its kernel")
      .def(
          "__copy__", [](const HostBufferHandle& h) { return h; },
          "a copy, as a C++ caller holds one (free invalidates only the handle passed)")
      .def("__repr__", [](const HostBufferHandle& h) {
        return "<UMBPHostBufferHandle ptr=" + Hex(h.ptr) +
               " requested_size=" + std::to_string(h.requested_size) +
               " mapped_size=" + std::to_string(h.mapped_size) +
               (host_gone(h) ? " (its simulated host is gone)>" : ">");
      });

  py::class_<HostMemAllocator::ShmAllocation>(m, "UMBPShmAllocation",
                                              "A live shm allocation found in the registry")
      .def_property_readonly("base",
                             [](const HostMemAllocator::ShmAllocation& a) {
                               return reinterpret_cast<uintptr_t>(a.base);
                             })
      .def_readonly("mapped_size", &HostMemAllocator::ShmAllocation::mapped_size)
      .def_readonly("fd", &HostMemAllocator::ShmAllocation::fd)
      .def("__repr__", [](const HostMemAllocator::ShmAllocation& a) {
        return "<UMBPShmAllocation base=" + Hex(a.base) +
               " mapped_size=" + std::to_string(a.mapped_size) + " fd=" + std::to_string(a.fd) +
               ">";
      });

  py::class_<HostMemAllocator>(m, "HostMemAllocator",
                               "A built-in allocator on a Kernel. A call that warns or crashes "
                               "goes to the outcome hook; use umbp_sim.UMBPHostMemAllocator.")
      .def_property_readonly("kernel", &HostMemAllocator::kernel)
      .def(
          "alloc",
          [](HostMemAllocator& a, size_t size, HostBufferBacking backing, size_t hugepage_size,
             int numa_node, bool prefault) {
            return reported_alloc(a, size, backing, hugepage_size, numa_node, prefault);
          },
          py::arg("size"), py::arg("backing"), py::arg("hugepage_size"), py::arg("numa_node"),
          py::arg("prefault"))
      .def(
          "free", [](HostMemAllocator& a, HostBufferHandle& h) { reported_free(a, h); },
          py::arg("handle"))
      .def(
          "lookup_shm_allocation",
          [](HostMemAllocator& a, uintptr_t ptr, size_t size) {
            return shm_query([&] { return a.LookupShmAllocation(ptr, size); });
          },
          py::arg("ptr"), py::arg("size"))
      .def(
          "acquire_shm_allocation",
          [](HostMemAllocator& a, uintptr_t ptr, size_t size) {
            return shm_query([&] { return a.AcquireShmAllocation(ptr, size); });
          },
          py::arg("ptr"), py::arg("size"))
      .def(
          "release_shm_allocation",
          [](HostMemAllocator& a, uintptr_t base) {
            CallOutcome c;
            {
              NativeCall nogil;
              a.ReleaseShmAllocation(base);
            }
            c.report(a);
          },
          py::arg("base"))
      .def("live_buffers",
           [](HostMemAllocator& a) {
             return records([&] { return a.LiveBuffers(); },
                            [](const LiveBuffer& b) {
                              py::dict d;
                              d["ptr"] = reinterpret_cast<uintptr_t>(b.ptr);
                              d["requested_size"] = b.requested_size;
                              d["mapped_size"] = b.mapped_size;
                              d["backing"] = b.backing;
                              d["alignment"] = b.alignment;
                              d["fd"] = b.fd;
                              d["numa_node"] = b.numa_node;
                              return d;
                            });
           })
      .def("shm_registry", [](HostMemAllocator& a) {
        return records([&] { return a.ShmRegistry(); },
                       [](const ShmRegistryEntry& e) {
                         py::dict d;
                         d["base"] = reinterpret_cast<uintptr_t>(e.base);
                         d["mapped_size"] = e.mapped_size;
                         d["fd"] = e.fd;
                         d["active_registrations"] = e.active_registrations;
                         d["pending_free"] = e.pending_free;
                         return d;
                       });
      });

  py::class_<UmbpSimAllocator, HostMemAllocator>(m, "UmbpSimAllocator",
                                                 "umbp-sim's allocator (mori with its fixes)")
      .def(py::init([](KernelPtr kernel) {
             return std::make_unique<UmbpSimAllocator>(std::move(kernel), collect_sink);
           }),
           py::arg("kernel"));
  py::class_<Mori624002cAllocator, HostMemAllocator>(
      m, "Mori624002cAllocator", "the model of mori's HostMemAllocator at 624002c")
      .def(py::init([](KernelPtr kernel) {
             return std::make_unique<Mori624002cAllocator>(std::move(kernel), collect_sink);
           }),
           py::arg("kernel"));
}

}  // namespace umbp::bindings
