#include "python/handle_object.h"

#include <stdexcept>
#include <typeinfo>
#include <utility>

namespace py = pybind11;

namespace umbp::bindings {
namespace {

const py::detail::type_info* g_tinfo = nullptr;

void* move_handle(const void* src) {
  auto* h = const_cast<HostBufferHandle*>(static_cast<const HostBufferHandle*>(src));
  return new HostBufferHandle(std::move(*h));
}

}  // namespace

void init_handle_object() {
  g_tinfo = py::detail::get_type_info(typeid(HostBufferHandle));
  if (!g_tinfo) throw std::logic_error("UMBPHostBufferHandle is not bound yet");
}

HostBufferHandle* handle_value(PyObject* o) {
  if (!g_tinfo || Py_TYPE(o) != g_tinfo->type) return nullptr;
  py::detail::value_and_holder v(reinterpret_cast<py::detail::instance*>(o), g_tinfo, 0, 0);
  if (!v.holder_constructed()) return nullptr;
  return static_cast<HostBufferHandle*>(v.value_ptr());
}

py::object new_handle_object(HostBufferHandle&& h) {
  // As py::cast(std::move(h)) does, minus its per-call lookup of the type record.
  return py::reinterpret_steal<py::object>(py::detail::type_caster_generic::cast(
      &h, py::return_value_policy::move, py::handle(), g_tinfo, nullptr, move_handle));
}

}  // namespace umbp::bindings
