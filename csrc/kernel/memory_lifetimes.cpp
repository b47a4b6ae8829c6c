#include "kernel/memory_lifetimes.h"

#include <pthread.h>

#include <iterator>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "kernel/sim_kernel.h"

namespace umbp {

namespace {

class Lifetimes {
 public:
  void simulated(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    owner_[id] = id;
  }

  void wrapper(uint64_t id, uint64_t inner) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = owner_.find(inner);
    if (it != owner_.end()) owner_[id] = it->second;
  }

  void gone(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = owner_.find(id);
    if (it == owner_.end()) return;  // not simulated memory
    const uint64_t sim = it->second;
    owner_.erase(it);
    if (sim != id) {
      // A wrapper goes first (it holds its SimKernel): its buffers go with the SimKernel.
      orphans_[sim].push_back(id);
      return;
    }
    add_gone(id);
    auto o = orphans_.find(id);
    if (o != orphans_.end()) {
      for (uint64_t w : o->second) add_gone(w);
      orphans_.erase(o);
    }
  }

  bool is_gone(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = gone_.upper_bound(id);
    if (it == gone_.begin()) return false;
    return id <= std::prev(it)->second;
  }

  void lock() { mu_.lock(); }
  void unlock() { mu_.unlock(); }

 private:
  // Adds id to the runs [lo, hi] of gone_, merging neighbours.
  void add_gone(uint64_t id) {
    auto next = gone_.upper_bound(id);
    const bool join_next = next != gone_.end() && next->first == id + 1;
    if (next != gone_.begin()) {
      auto prev = std::prev(next);
      if (id <= prev->second) return;
      if (prev->second + 1 == id) {
        prev->second = join_next ? next->second : id;
        if (join_next) gone_.erase(next);
        return;
      }
    }
    const uint64_t hi = join_next ? next->second : id;
    if (join_next) gone_.erase(next);
    gone_.emplace(id, hi);
  }

  std::mutex mu_;                                 // a leaf lock
  std::unordered_map<uint64_t, uint64_t> owner_;  // live kernel -> the SimKernel of its memory
  std::unordered_map<uint64_t, std::vector<uint64_t>> orphans_;  // SimKernel -> wrappers gone
  std::map<uint64_t, uint64_t> gone_;  // runs of kernel ids whose buffers' memory is gone
};

Lifetimes& lifetimes() {
  // Never destroyed: kernels may be destroyed during static destruction.
  static Lifetimes* l = [] {
    auto* p = new Lifetimes;
    ::pthread_atfork([] { lifetimes().lock(); }, [] { lifetimes().unlock(); },
                     [] { lifetimes().unlock(); });
    return p;
  }();
  return *l;
}

}  // namespace

void note_simulated_memory(uint64_t sim_kernel_id) { lifetimes().simulated(sim_kernel_id); }
void note_wrapper(uint64_t wrapper_id, uint64_t inner_id) {
  lifetimes().wrapper(wrapper_id, inner_id);
}
void note_kernel_gone(uint64_t kernel_id) { lifetimes().gone(kernel_id); }
bool memory_gone(uint64_t kernel_id) { return lifetimes().is_gone(kernel_id); }

void register_fork_handlers() {
  lifetimes();
  SimKernel::register_fork_handlers();
}

}  // namespace umbp
