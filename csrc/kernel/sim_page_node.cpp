// SimKernel::page_node: where a page of the simulated process is, as move_pages(2) answers a
// query (nodes == NULL): the interposer answers a program's move_pages with it (umbp-sim exec).
#include <cerrno>

#include "kernel/sim_kernel.h"

namespace umbp {

int SimKernel::page_node(uintptr_t addr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = vmas_.upper_bound(addr);
  if (it == vmas_.begin()) return -EFAULT;
  --it;
  const SimVma& v = it->second;
  if (addr >= v.end) return -EFAULT;
  const uint64_t page = v.pgoff + (addr - v.start) / v.obj->page;
  for (const PageSegment& seg : v.obj->pages.segments(page, 1))
    if (seg.state == PageState::Faulted && !seg.nodes.empty()) return seg.nodes.front().first;
  return -ENOENT;
}

}  // namespace umbp
