#include "python/bindings.h"
#include "python/native_call.h"

PYBIND11_MODULE(_native, m) {
  m.doc() = "umbp-sim native core: the allocator and the kernels it stands on";
  umbp::bindings::install_fork_gate();
  umbp::bindings::bind_kernel(m);
  umbp::bindings::bind_linux(m);
  umbp::bindings::bind_allocator(m);
  umbp::bindings::bind_fast_calls(m);
  umbp::bindings::bind_sim(m);
  umbp::bindings::bind_faults(m);
  umbp::bindings::bind_capi(m);
}
