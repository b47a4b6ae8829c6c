#include "python/call_outcome.h"

#include <stdexcept>

#include "kernel/crash_record.h"
#include "python/native_call.h"

namespace py = pybind11;

namespace umbp::bindings {
namespace {
thread_local std::vector<std::tuple<LogLevel, std::string, std::string>>* tls_messages = nullptr;
}  // namespace

void collect_sink(LogLevel level, const std::string& id, const std::string& text) {
  if (tls_messages) tls_messages->emplace_back(level, id, text);
}

py::object& outcome_hook() {
  static auto* hook = new py::object();
  return *hook;
}

CallOutcome::CallOutcome() : prev_(tls_messages), crash_(&this_thread_crash()) {
  tls_messages = &messages_;
  crash_->clear();
}

CallOutcome::~CallOutcome() { tls_messages = prev_; }

// Nothing to report: no message, no crash (the common case, answered without Python objects).
bool CallOutcome::quiet() const { return messages_.empty() && crash_->signal == 0; }

py::list CallOutcome::to_list() const {
  py::list out;
  for (const auto& m : messages_) {
    out.append(py::make_tuple(std::get<0>(m) == LogLevel::Warning ? "warning" : "info",
                              std::get<1>(m), std::get<2>(m)));
  }
  return out;
}

void CallOutcome::report(HostMemAllocator& allocator) const {
  if (quiet()) return;
  if (!outcome_hook()) {
    throw std::runtime_error(
        "umbp_sim._native: an allocator call warned or crashed and no outcome hook is set "
        "(import umbp_sim.allocator)");
  }
  const CallCrash& c = *crash_;
  // The allocator's existing Python object (it is bound: the call came through it).
  py::object self = py::cast(&allocator, py::return_value_policy::reference);
  outcome_hook()(self, to_list(), c.signal, std::string(c.where));
}

HostBufferHandle reported_alloc(HostMemAllocator& a, size_t size, HostBufferBacking backing,
                                size_t hugepage_size, int numa_node, bool prefault) {
  CallOutcome c;
  HostBufferHandle h;
  {
    NativeCall nogil;
    h = a.Alloc(size, backing, hugepage_size, numa_node, prefault);
  }
  c.report(a);
  return h;
}

void reported_free(HostMemAllocator& a, HostBufferHandle& h) {
  CallOutcome c;
  {
    NativeCall nogil;
    a.Free(h);
  }
  c.report(a);
}

}  // namespace umbp::bindings
