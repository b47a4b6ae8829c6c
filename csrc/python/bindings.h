// Each part of the Python module binds itself in its own translation unit.
#pragma once

#include <pybind11/pybind11.h>

namespace umbp::bindings {

void bind_kernel(pybind11::module_& m);      // Kernel handle, SysResult, raw calls, constants
void bind_linux(pybind11::module_& m);       // LinuxKernel
void bind_allocator(pybind11::module_& m);   // HostMemAllocator, backings, handles
void bind_fast_calls(pybind11::module_& m);  // alloc/free's path for plain calls
void bind_sim(pybind11::module_& m);         // SimKernel
void bind_faults(pybind11::module_& m);      // FaultyKernel, TracingKernel
void bind_capi(pybind11::module_& m);        // Kernel <-> capsule of the C ABI

}  // namespace umbp::bindings
