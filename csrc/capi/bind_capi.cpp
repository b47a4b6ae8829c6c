// Python's side of the C ABI: a Kernel as a capsule holding a umbp_sim_kernel*.
#include <pybind11/pybind11.h>

#include "capi/kernel_capi.h"
#include "kernel/kernel.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace umbp::bindings {
namespace {

void release_capsule(PyObject* capsule) {
  auto* k = static_cast<umbp_sim_kernel*>(PyCapsule_GetPointer(capsule, UMBP_SIM_KERNEL_CAPSULE));
  if (k) k->ops->release(k->self);
}

}  // namespace

void bind_capi(py::module_& m) {
  m.attr("KERNEL_CAPSULE") = UMBP_SIM_KERNEL_CAPSULE;
  m.attr("KERNEL_ABI_VERSION") = UMBP_SIM_KERNEL_ABI_VERSION;
  m.def(
      "kernel_capsule",
      [](KernelPtr kernel) {
        if (!kernel) throw py::type_error("kernel_capsule: kernel must not be None");
        umbp_sim_kernel* c = capi::make_c_kernel(std::move(kernel));
        PyObject* cap = PyCapsule_New(c, UMBP_SIM_KERNEL_CAPSULE, release_capsule);
        if (!cap) {
          c->ops->release(c->self);
          throw py::error_already_set();
        }
        return py::reinterpret_steal<py::object>(cap);
      },
      py::arg("kernel"), "A PyCapsule 'umbp_sim.kernel' holding a umbp_sim_kernel* (C ABI)");
  m.def(
      "kernel_from_capsule",
      [](py::capsule cap) -> KernelPtr {
        auto* c =
            static_cast<umbp_sim_kernel*>(PyCapsule_GetPointer(cap.ptr(), UMBP_SIM_KERNEL_CAPSULE));
        if (!c) throw py::error_already_set();
        return capi::kernel_of(c);
      },
      py::arg("capsule"), "The Kernel inside a capsule made by kernel_capsule");
}

}  // namespace umbp::bindings
