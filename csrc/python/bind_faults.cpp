// FaultyKernel, TracingKernel and their records as Python objects. The user-facing plan
// (names, TOML) is umbp_sim.faults.FaultPlan; this layer takes numeric rules.
#include <pybind11/stl.h>

#include <stdexcept>

#include "kernel/faulty_kernel.h"
#include "kernel/syscall_format.h"
#include "kernel/tracing_kernel.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace umbp::bindings {
namespace {

constexpr const char* kWhenNames[] = {"always", "nth", "range", "every", "first"};

SysOp op_from(const std::string& name) {
  int i = sysop_from_name(name);
  if (i < 0) throw py::value_error("unknown operation '" + name + "'");
  return static_cast<SysOp>(i);
}

// The arguments that matter for the operation, by name (a call on a range of memory names the
// range first).
py::dict args_dict(const SyscallArgs& a) {
  py::dict d;
  auto range = [&] {
    d["addr"] = a.addr;
    d["length"] = a.length;
  };
  switch (a.op) {
    case SysOp::mmap:
      range();
      d["prot"] = a.prot;
      d["flags"] = a.flags;
      d["fd"] = a.fd;
      d["offset"] = a.offset;
      break;
    case SysOp::munmap:
      range();
      break;
    case SysOp::madvise:
      range();
      d["advice"] = a.advice;
      break;
    case SysOp::mbind:
      range();
      d["mode"] = a.mode;
      d["nodes"] = a.null_mask ? py::object(py::none()) : py::object(py::cast(a.nodes));
      d["maxnode"] = a.maxnode;
      d["flags"] = a.flags;
      break;
    case SysOp::memfd_create:
      d["name"] = a.text;
      d["flags"] = a.flags;
      break;
    case SysOp::ftruncate:
      d["fd"] = a.fd;
      d["length"] = a.length;
      break;
    case SysOp::close:
      d["fd"] = a.fd;
      break;
    case SysOp::read_file:
      d["path"] = a.text;
      break;
    case SysOp::touch:
      range();
      d["stride"] = a.stride;
      break;
    case SysOp::page_size:  // not an operation: never traced
      break;
  }
  return d;
}

// A simulated crash is described by the kernel that decided it (SimKernel.crash_info()); a
// wrapper passes the question down so the allocator's SimulatedCrash keeps node and page size.
// An injected signal has no description: None.
py::object inner_crash_info(const KernelPtr& inner) {
  py::object k = py::cast(inner);
  if (!py::hasattr(k, "crash_info")) return py::none();
  return k.attr("crash_info")();
}

}  // namespace

void bind_faults(py::module_& m) {
  // The seam's operations by name, in SysOp order (UMBP_KERNEL_CALLS): umbp_sim.faults.OPS.
  py::list ops;
  for (int i = 0; i < kSysOpCount; ++i) ops.append(sysop_name(static_cast<SysOp>(i)));
  m.attr("SYSCALL_OPS") = py::tuple(ops);
  m.def(
      "syscall_names",
      [](const std::string& kind) {
        py::dict d;
        for (const auto& [name, value] : named_values(kind)) d[py::str(name)] = value;
        if (d.empty()) throw py::value_error("unknown name table '" + kind + "'");
        return d;
      },
      py::arg("kind"),
      "Name -> value table used by the decoders: errno, signal, prot, mmap_flags, advice, "
      "mpol_mode, mpol_mode_flags, mbind_flags, memfd_flags");

  py::class_<FaultRule> rule(m, "FaultRule",
                             "One numeric fault rule (see umbp_sim.faults.FaultRule)");
#define UMBP_RULE(f) rule.def_readwrite(#f, &FaultRule::f);
  UMBP_FAULT_RULE_FIELDS(UMBP_RULE)
#undef UMBP_RULE
  rule.def(py::init<>())
      .def_property(
          "op", [](const FaultRule& r) { return std::string(sysop_name(r.op)); },
          [](FaultRule& r, const std::string& s) { r.op = op_from(s); })
      .def_property(
          "content",
          [](const FaultRule& r) -> py::object {
            return r.has_content ? py::object(py::str(r.content)) : py::object(py::none());
          },
          [](FaultRule& r, std::optional<std::string> c) {
            r.has_content = c.has_value();
            r.content = c.value_or("");
          })
      .def_property(
          "when",
          [](const FaultRule& r) { return std::string(kWhenNames[static_cast<int>(r.when)]); },
          [](FaultRule& r, const std::string& s) {
            for (int i = 0; i < 5; ++i)
              if (s == kWhenNames[i]) {
                r.when = static_cast<FaultRule::When>(i);
                return;
              }
            throw py::value_error("unknown schedule '" + s + "'");
          })
      .def("problem", &FaultRule::problem);

  py::class_<FaultRecord>(m, "FaultRecord", "One injected answer")
      .def_readonly("rule", &FaultRecord::rule)
      .def_readonly("rule_name", &FaultRecord::rule_name)
      .def_readonly("call", &FaultRecord::call)
      .def_property_readonly(
          "op", [](const FaultRecord& r) { return std::string(sysop_name(r.args.op)); })
      .def_property_readonly("args", [](const FaultRecord& r) { return args_dict(r.args); })
      .def_property_readonly("call_text", [](const FaultRecord& r) { return format_call(r.args); })
      .def_readonly("error", &FaultRecord::error)
      .def_readonly("signal", &FaultRecord::signal)
      .def_readonly("threw", &FaultRecord::threw)
      .def_property_readonly(
          "errno_name", [](const FaultRecord& r) { return std::string(errno_symbol(r.error)); })
      .def_property_readonly(
          "signal_name",
          [](const FaultRecord& r) { return r.signal ? std::string(signal_symbol(r.signal)) : ""; })
      .def("__repr__", [](const FaultRecord& r) {
        std::string what = r.threw    ? "throw std::bad_alloc"
                           : r.signal ? signal_symbol(r.signal)
                                      : errno_symbol(r.error);
        return "<FaultRecord rule " + std::to_string(r.rule) +
               (r.rule_name.empty() ? "" : " (" + r.rule_name + ")") + " call " +
               std::to_string(r.call) + ": " + format_call(r.args) + " -> " + what + ">";
      });

  py::class_<FaultyKernel, Kernel, std::shared_ptr<FaultyKernel>>(
      m, "FaultyKernel", "Wraps a Kernel and injects errors by rule; records what fired")
      .def(py::init<KernelPtr, std::vector<FaultRule>>(), py::arg("inner"), py::arg("rules"))
      .def_property_readonly("inner", &FaultyKernel::inner)
      .def_property_readonly("rules", &FaultyKernel::rules)
      .def("records", &FaultyKernel::records)
      .def("calls", &FaultyKernel::calls, py::arg("rule"))
      .def("fires", &FaultyKernel::fires, py::arg("rule"))
      .def("reset", &FaultyKernel::reset)
      .def("crash_info", [](const FaultyKernel& k) { return inner_crash_info(k.inner()); });

  py::class_<TraceRecord>(m, "TraceRecord", "One traced call")
      .def_readonly("seq", &TraceRecord::seq)
      .def_property_readonly(
          "op", [](const TraceRecord& r) { return std::string(sysop_name(r.args.op)); })
      .def_property_readonly("args", [](const TraceRecord& r) { return args_dict(r.args); })
      .def_readonly("result", &TraceRecord::result)
      .def_readonly("injected", &TraceRecord::injected)
      .def_readonly("threw", &TraceRecord::threw)
      .def_readonly("site", &TraceRecord::site,
                    "index in the TracingKernel's call_sites(), -1 none")
      .def("text", &TraceRecord::text)
      .def("__repr__", [](const TraceRecord& r) { return "<TraceRecord " + r.text() + ">"; });

  py::class_<TracingKernel, Kernel, std::shared_ptr<TracingKernel>>(
      m, "TracingKernel", "Wraps a Kernel and records every call, strace-style")
      .def(py::init<KernelPtr, size_t>(), py::arg("inner"), py::arg("limit") = 100000)
      .def_property_readonly("inner", &TracingKernel::inner)
      .def("records", &TracingKernel::records)
      .def("text", &TracingKernel::text)
      .def_property_readonly("dropped", &TracingKernel::dropped)
      .def_property_readonly("calls", &TracingKernel::calls)
      .def("live_mappings", &TracingKernel::live_mappings)
      .def("open_fds", &TracingKernel::open_fds)
      .def("call_sites", &TracingKernel::call_sites,
           "(object path, offset) of each call site the records name (the interposer's)")
      .def_property_readonly("sites_dropped", &TracingKernel::sites_dropped)
      .def("clear", &TracingKernel::clear)
      .def("crash_info", [](const TracingKernel& k) { return inner_crash_info(k.inner()); });
}

}  // namespace umbp::bindings
