// Any umbp::Kernel as a umbp_sim_kernel (csrc/capi/umbp_sim/kernel.h): the C ABI the interposer
// and users' C code call.
#pragma once

#include "capi/umbp_sim/kernel.h"
#include "kernel/kernel.h"

namespace umbp::capi {

// A new C handle owning one reference to `kernel`; release it with handle->ops->release.
umbp_sim_kernel* make_c_kernel(KernelPtr kernel);
// The C++ kernel behind a handle made by make_c_kernel.
KernelPtr kernel_of(const umbp_sim_kernel* handle);

}  // namespace umbp::capi
