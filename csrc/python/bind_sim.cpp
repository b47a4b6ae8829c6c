// Placeholder until this part of the module lands; replaced by its owner.
#include "python/bindings.h"

namespace umbp::bindings {
void bind_sim(pybind11::module_&) {}
}  // namespace umbp::bindings
