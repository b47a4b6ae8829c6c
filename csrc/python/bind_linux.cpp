#include "kernel/linux_kernel.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace umbp::bindings {
void bind_linux(py::module_& m) {
  py::class_<LinuxKernel, Kernel, std::shared_ptr<LinuxKernel>>(
      m, "LinuxKernel", "The kernel seam passed straight through to the running kernel")
      .def(py::init<>());
}
}  // namespace umbp::bindings
