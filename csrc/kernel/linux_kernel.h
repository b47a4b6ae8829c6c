// LinuxKernel: the seam passed straight through to the running kernel.
#pragma once

#include "kernel/kernel.h"

namespace umbp {

class LinuxKernel final : public Kernel {
 public:
  UMBP_KERNEL_OVERRIDES
};

}  // namespace umbp
