// The hot path of umbp_sim.UMBPHostMemAllocator. A test that stands in for mori makes alloc and
// free calls by the thousand (bench/bench_sim_rate.py); through a Python method and pybind11's
// argument dispatch each costs more than the simulated kernel's work. `fast_method(fn, kind)`
// wraps the Python method `fn` ("alloc" or "free") of the class: read from the class it is `fn`
// itself; read from an instance it is a bound callable whose plain calls (alloc: 1 to 5
// positional arguments, exact ints in range, a backing value, True/False; free: a handle) go by
// one vectorcall to the instance's native allocator (`_native`), and whose other calls
// (keywords, other types, values out of range) go to `fn`, which checks, converts and raises as
// it always did. Both paths make the same native call (call_outcome.h reported_alloc/_free).
#include <Python.h>
#include <pybind11/pybind11.h>
#include <structmember.h>

#include <climits>
#include <cstdint>

#include "allocator/host_buffer.h"
#include "allocator/host_mem_allocator.h"
#include "python/bindings.h"
#include "python/call_outcome.h"
#include "python/handle_object.h"

namespace py = pybind11;

namespace umbp::bindings {
namespace {

enum class Which { Alloc, Free };

// A method bound to one allocator (what `allocator.alloc` is).
struct FastCall {
  PyObject ob_base;
  vectorcallfunc vectorcall;
  Which which;
  HostMemAllocator* allocator;  // owned by `native`
  PyObject* native;             // the instance's native allocator (kept alive)
  PyObject* owner;              // the instance
  PyObject* func;               // the Python method: the calls that are not plain
};

// The method as the class holds it.
struct FastMethod {
  PyObject ob_base;
  Which which;
  PyObject* func;
};

PyTypeObject* g_call_type = nullptr;
PyTypeObject* g_method_type = nullptr;
PyObject* g_backings[4] = {};  // UMBPHostBufferBacking's four values, in enum order
PyTypeObject* g_handle_type = nullptr;

// What pybind11 would raise for an exception out of the native call.
PyObject* translated() {
  try {
    throw;
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (...) {
    py::detail::try_translate_exceptions();
  }
  return nullptr;
}

// The Python method, given the call as it came (a plain bound method prepends the instance).
PyObject* slow(FastCall* f, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  PyObject* bound = PyMethod_New(f->func, f->owner);
  if (!bound) return nullptr;
  PyObject* out = PyObject_Vectorcall(bound, args, nargsf, kwnames);
  Py_DECREF(bound);
  return out;
}

// An exact int in [0, 2^64): its value; false for anything else (the Python method decides).
bool plain_size(PyObject* o, size_t* out) {
  if (!PyLong_CheckExact(o)) return false;
  const unsigned long long v = PyLong_AsUnsignedLongLong(o);
  if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();  // negative or past 2^64: the Python method says which
    return false;
  }
  *out = static_cast<size_t>(v);
  return true;
}

bool plain_node(PyObject* o, int* out) {
  if (!PyLong_CheckExact(o)) return false;
  int overflow = 0;
  const long v = PyLong_AsLongAndOverflow(o, &overflow);
  if (overflow || v < INT_MIN || v > INT_MAX) return false;
  *out = v < -1 ? -1 : static_cast<int>(v);  // below -1 means "no node", as -1 does
  return true;
}

bool plain_backing(PyObject* o, HostBufferBacking* out) {
  for (int i = 0; i < 4; ++i) {
    if (o == g_backings[i]) {
      *out = static_cast<HostBufferBacking>(i);
      return true;
    }
  }
  return false;
}

PyObject* fast_alloc(FastCall* f, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  const Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  size_t size = 0, hugepage_size = 2097152;
  HostBufferBacking backing = HostBufferBacking::Anonymous;
  int node = -1;
  bool prefault = true;
  if (kwnames || n < 1 || n > 5 || !plain_size(args[0], &size) ||
      (n > 1 && !plain_backing(args[1], &backing)) ||
      (n > 2 && !plain_size(args[2], &hugepage_size)) || (n > 3 && !plain_node(args[3], &node)) ||
      (n > 4 && args[4] != Py_True && args[4] != Py_False))
    return slow(f, args, nargsf, kwnames);
  if (n > 4) prefault = args[4] == Py_True;
  try {
    HostBufferHandle h =
        reported_alloc(*f->allocator, size, backing, hugepage_size, node, prefault);
    return new_handle_object(std::move(h)).release().ptr();
  } catch (...) {
    return translated();
  }
}

PyObject* fast_free(FastCall* f, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  if (kwnames || PyVectorcall_NARGS(nargsf) != 1 || Py_TYPE(args[0]) != g_handle_type)
    return slow(f, args, nargsf, kwnames);
  try {
    HostBufferHandle* h = handle_value(args[0]);
    reported_free(*f->allocator, h ? *h : py::cast<HostBufferHandle&>(py::handle(args[0])));
    Py_RETURN_NONE;
  } catch (...) {
    return translated();
  }
}

PyObject* fast_call(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* f = reinterpret_cast<FastCall*>(self);
  if (!f->allocator) {  // cleared by the cycle collector: its allocator is gone
    PyErr_SetString(PyExc_ReferenceError, "this allocator has been collected");
    return nullptr;
  }
  return f->which == Which::Alloc ? fast_alloc(f, args, nargsf, kwnames)
                                  : fast_free(f, args, nargsf, kwnames);
}

int call_traverse(PyObject* self, visitproc visit, void* arg) {
  auto* f = reinterpret_cast<FastCall*>(self);
  Py_VISIT(Py_TYPE(self));  // a heap type's instances hold it
  Py_VISIT(f->native);
  Py_VISIT(f->owner);  // an instance that keeps its own bound method: a cycle to see
  Py_VISIT(f->func);
  return 0;
}

int call_clear(PyObject* self) {
  auto* f = reinterpret_cast<FastCall*>(self);
  f->allocator = nullptr;
  Py_CLEAR(f->native);
  Py_CLEAR(f->owner);
  Py_CLEAR(f->func);
  return 0;
}

void call_dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  call_clear(self);
  type->tp_free(self);
  Py_DECREF(type);  // each instance of a heap type holds a reference to it
}

PyObject* call_repr(PyObject* self) {
  auto* f = reinterpret_cast<FastCall*>(self);
  if (!f->func) return PyUnicode_FromString("<bound method (collected)>");
  PyObject* name = PyObject_GetAttrString(f->func, "__qualname__");
  if (!name) return nullptr;
  PyObject* out = PyUnicode_FromFormat("<bound method %S of %R>", name, f->owner);
  Py_DECREF(name);
  return out;
}

// What a bound method forwards to its function: its name, qualified name and docstring.
PyObject* call_forward(PyObject* self, void* attr) {
  auto* f = reinterpret_cast<FastCall*>(self);
  if (!f->func) return PyErr_Format(PyExc_ReferenceError, "this allocator has been collected");
  return PyObject_GetAttrString(f->func, static_cast<const char*>(attr));
}

// inspect.signature of the bound method: the function's without its first parameter.
PyObject* call_signature(PyObject* self, void*) {
  auto* f = reinterpret_cast<FastCall*>(self);
  if (!f->func) return PyErr_Format(PyExc_ReferenceError, "this allocator has been collected");
  try {
    py::object sig = py::module_::import("inspect").attr("signature")(
        py::reinterpret_borrow<py::object>(f->func));
    py::list params(sig.attr("parameters").attr("values")());
    params.attr("pop")(0);
    return sig.attr("replace")(py::arg("parameters") = params).release().ptr();
  } catch (...) {
    return translated();
  }
}

PyGetSetDef call_getset[] = {
    {"__name__", call_forward, nullptr, nullptr, const_cast<char*>("__name__")},
    {"__qualname__", call_forward, nullptr, nullptr, const_cast<char*>("__qualname__")},
    {"__doc__", call_forward, nullptr, nullptr, const_cast<char*>("__doc__")},
    {"__signature__", call_signature, nullptr, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

// Equal when bound to the same instance with the same function, as bound methods are.
PyObject* call_richcompare(PyObject* a, PyObject* b, int op) {
  if ((op != Py_EQ && op != Py_NE) || Py_TYPE(b) != Py_TYPE(a)) Py_RETURN_NOTIMPLEMENTED;
  auto* x = reinterpret_cast<FastCall*>(a);
  auto* y = reinterpret_cast<FastCall*>(b);
  const bool eq = x->owner == y->owner && x->func == y->func;
  return PyBool_FromLong(eq == (op == Py_EQ));
}

Py_hash_t call_hash(PyObject* self) {
  auto* f = reinterpret_cast<FastCall*>(self);
  const auto bits = (reinterpret_cast<uintptr_t>(f->owner) >> 4) ^
                    (reinterpret_cast<uintptr_t>(f->func) >> 4) * 31;
  const auto h = static_cast<Py_hash_t>(bits);
  return h == -1 ? -2 : h;
}

PyMemberDef call_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, static_cast<Py_ssize_t>(offsetof(FastCall, vectorcall)),
     READONLY, nullptr},
    {"__func__", T_OBJECT, static_cast<Py_ssize_t>(offsetof(FastCall, func)), READONLY, nullptr},
    {"__self__", T_OBJECT, static_cast<Py_ssize_t>(offsetof(FastCall, owner)), READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr}};

PyType_Slot call_slots[] = {{Py_tp_dealloc, reinterpret_cast<void*>(call_dealloc)},
                            {Py_tp_traverse, reinterpret_cast<void*>(call_traverse)},
                            {Py_tp_clear, reinterpret_cast<void*>(call_clear)},
                            {Py_tp_repr, reinterpret_cast<void*>(call_repr)},
                            {Py_tp_call, reinterpret_cast<void*>(PyVectorcall_Call)},
                            {Py_tp_members, call_members},
                            {Py_tp_getset, call_getset},
                            {Py_tp_richcompare, reinterpret_cast<void*>(call_richcompare)},
                            {Py_tp_hash, reinterpret_cast<void*>(call_hash)},
                            {0, nullptr}};

PyType_Spec call_spec = {"umbp_sim._native.FastBoundMethod", sizeof(FastCall), 0,
                         Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                             Py_TPFLAGS_DISALLOW_INSTANTIATION | Py_TPFLAGS_IMMUTABLETYPE,
                         call_slots};

// instance.alloc: bound to the instance's native allocator, or (no such allocator: __init__ did
// not run, or failed) a plain bound method, whose call says what is wrong.
PyObject* method_get(PyObject* self, PyObject* instance, PyObject* /*owner*/) {
  auto* m = reinterpret_cast<FastMethod*>(self);
  if (!instance || instance == Py_None) {
    Py_INCREF(m->func);
    return m->func;
  }
  static PyObject* const native_name = PyUnicode_InternFromString("_native");
  PyObject* native = PyObject_GetAttr(instance, native_name);
  if (!native) {
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return nullptr;
    PyErr_Clear();  // __init__ did not run (or failed): the method says what that means
    return PyMethod_New(m->func, instance);
  }
  HostMemAllocator* allocator = nullptr;
  try {
    allocator = py::cast<HostMemAllocator*>(py::handle(native));
  } catch (const py::cast_error&) {
    allocator = nullptr;  // not a native allocator: the method's to use
  } catch (...) {
    Py_DECREF(native);
    return translated();
  }
  if (!allocator) {
    Py_DECREF(native);
    return PyMethod_New(m->func, instance);
  }
  auto* f = PyObject_GC_New(FastCall, g_call_type);
  if (!f) {
    Py_DECREF(native);
    return nullptr;
  }
  f->vectorcall = fast_call;
  f->which = m->which;
  f->allocator = allocator;
  f->native = native;
  Py_INCREF(instance);
  f->owner = instance;
  Py_INCREF(m->func);
  f->func = m->func;
  PyObject_GC_Track(f);
  return reinterpret_cast<PyObject*>(f);
}

int method_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(reinterpret_cast<FastMethod*>(self)->func);
  return 0;
}

int method_clear(PyObject* self) {
  Py_CLEAR(reinterpret_cast<FastMethod*>(self)->func);
  return 0;
}

void method_dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  method_clear(self);
  type->tp_free(self);
  Py_DECREF(type);
}

PyMemberDef method_members[] = {
    {"__func__", T_OBJECT, static_cast<Py_ssize_t>(offsetof(FastMethod, func)), READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr}};

PyType_Slot method_slots[] = {{Py_tp_dealloc, reinterpret_cast<void*>(method_dealloc)},
                              {Py_tp_traverse, reinterpret_cast<void*>(method_traverse)},
                              {Py_tp_clear, reinterpret_cast<void*>(method_clear)},
                              {Py_tp_descr_get, reinterpret_cast<void*>(method_get)},
                              {Py_tp_members, method_members},
                              {0, nullptr}};

PyType_Spec method_spec = {"umbp_sim._native.FastMethod", sizeof(FastMethod), 0,
                           Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC |
                               Py_TPFLAGS_DISALLOW_INSTANTIATION | Py_TPFLAGS_IMMUTABLETYPE,
                           method_slots};

}  // namespace

void bind_fast_calls(py::module_& m) {
  g_call_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&call_spec));
  g_method_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&method_spec));
  if (!g_call_type || !g_method_type) throw py::error_already_set();
  py::object backing = m.attr("UMBPHostBufferBacking");
  const char* names[4] = {"Anonymous", "AnonymousHugetlb", "AnonymousShm", "AnonymousShmHugetlb"};
  for (int i = 0; i < 4; ++i) {
    py::object v = backing.attr(names[i]);
    if (py::cast<HostBufferBacking>(v) != static_cast<HostBufferBacking>(i))
      throw std::logic_error("UMBPHostBufferBacking's values are not in enum order");
    g_backings[i] = v.release().ptr();  // kept for the module's life
  }
  g_handle_type = reinterpret_cast<PyTypeObject*>(m.attr("UMBPHostBufferHandle").ptr());
  init_handle_object();
  m.def(
      "fast_method",
      [](py::function fn, const std::string& kind) {
        if (kind != "alloc" && kind != "free")
          throw py::value_error("fast_method: kind is 'alloc' or 'free', got '" + kind + "'");
        auto* d = PyObject_GC_New(FastMethod, g_method_type);
        if (!d) throw py::error_already_set();
        d->which = kind == "alloc" ? Which::Alloc : Which::Free;
        d->func = fn.release().ptr();
        PyObject_GC_Track(d);
        return py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(d));
      },
      py::arg("fn"), py::arg("kind"),
      "`fn` (a UMBPHostMemAllocator's alloc or free) with a native path for plain calls");
}

}  // namespace umbp::bindings
