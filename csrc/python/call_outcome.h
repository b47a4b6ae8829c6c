// What one native allocator call said besides its result: its warnings and, when its kernel
// raised one, a simulated crash. A call returns its result alone; one that warned or crashed is
// first handed to the outcome hook (`set_outcome_hook(fn)`: fn(allocator, messages, signal,
// where), each message as (level, id, text), called with the GIL back, what it raises
// propagating). umbp_sim/allocator.py sets it: logging records and SimulatedCrash.
#pragma once

#include <pybind11/pybind11.h>

#include <string>
#include <tuple>
#include <vector>

#include "allocator/host_buffer.h"
#include "allocator/host_mem_allocator.h"
#include "kernel/crash_record.h"

namespace umbp::bindings {

// The allocator's log sink: the messages of the call running on this thread.
void collect_sink(LogLevel level, const std::string& id, const std::string& text);

// Set once by umbp_sim.allocator; never destroyed (calls may run at interpreter shutdown).
pybind11::object& outcome_hook();

// Collects the messages of one call made on this thread (the allocator calls its sink
// synchronously on the calling thread, with the GIL released), and clears this thread's crash
// record: what the call's kernel records is this call's.
class CallOutcome {
 public:
  CallOutcome();
  ~CallOutcome();
  CallOutcome(const CallOutcome&) = delete;
  CallOutcome& operator=(const CallOutcome&) = delete;
  // Hand a call of `allocator` that warned or crashed to the outcome hook (which may raise).
  void report(HostMemAllocator& allocator) const;

 private:
  bool quiet() const;
  pybind11::list to_list() const;

  using Messages = std::vector<std::tuple<LogLevel, std::string, std::string>>;
  Messages messages_;
  Messages* prev_;
  CallCrash* crash_;  // this thread's crash record, looked up once (a thread_local of a module)
};

// Alloc and Free as every Python path makes them: the GIL released (NativeCall), the outcome
// reported after (what the hook raises propagates as a C++ exception).
HostBufferHandle reported_alloc(HostMemAllocator& a, size_t size, HostBufferBacking backing,
                                size_t hugepage_size, int numa_node, bool prefault);
void reported_free(HostMemAllocator& a, HostBufferHandle& h);

}  // namespace umbp::bindings
