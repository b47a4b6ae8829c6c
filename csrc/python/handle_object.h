// The Python object of a HostBufferHandle (UMBPHostBufferHandle) on the hot path: made and read
// with the class's pybind11 type record looked up once, instead of by typeid on every call.
// Every alloc returns one, every free and `if not h` reads one (bench/bench_sim_rate.py).
#pragma once

#include <pybind11/pybind11.h>

#include "allocator/host_buffer.h"

namespace umbp::bindings {

// Once UMBPHostBufferHandle is bound (bind_allocator).
void init_handle_object();

// The handle inside `o` when `o` is exactly a UMBPHostBufferHandle whose C++ value is made;
// nullptr otherwise (a subclass, no __init__ yet): then pybind11's own cast decides.
HostBufferHandle* handle_value(PyObject* o);

// A new UMBPHostBufferHandle owning `h` (moved): what py::cast(std::move(h)) makes.
pybind11::object new_handle_object(HostBufferHandle&& h);

}  // namespace umbp::bindings
