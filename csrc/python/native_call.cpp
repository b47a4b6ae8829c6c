#include "python/native_call.h"

#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <new>

#include "kernel/memory_lifetimes.h"

namespace umbp::bindings {

namespace {

// The gate: a count of native calls in flight, and whether a fork() is waiting for them. Its
// mutex stays taken from the prepare handler until after the fork; the child, a single thread,
// starts with a new gate (threads waiting in the parent do not exist there).
// A call enters and leaves with atomics alone while no fork waits (two per call, on every
// alloc and free): it counts itself in, then looks at `forking`; the fork sets `forking`, then
// looks at the count. Both sequentially consistent, so one of the two sees the other: a call
// that saw no fork is waited for, and one that saw it steps back out and waits for the fork.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<long> calls{0};
  std::atomic<bool> forking{false};
};

// Native calls in flight on this thread (a fork() made from inside one waits for the others).
thread_local long t_calls = 0;

Gate* gate() {
  static Gate* g = new Gate;  // never destroyed: calls may run during interpreter shutdown
  return g;
}

void prepare() {
  Gate* g = gate();
  std::unique_lock<std::mutex> lock(g->mu);
  g->forking.store(true);
  g->cv.wait(lock, [g] { return g->calls.load() == t_calls; });
  lock.release();  // held across fork()
}

void parent() {
  Gate* g = gate();
  g->forking.store(false);
  g->mu.unlock();
  g->cv.notify_all();
}

void child() {
  // Not destroyed: the old condition variable may still count the parent's waiters.
  new (gate()) Gate;
  gate()->calls.store(t_calls);
}

}  // namespace

void install_fork_gate() {
  static const bool installed = [] {
    // The kernels' own handlers first: prepare handlers run in the reverse order, so this
    // gate's waits for the calls in flight (which may take those locks) before they lock.
    register_fork_handlers();
    gate();
    return ::pthread_atfork(prepare, parent, child) == 0;
  }();
  (void)installed;
}

void fork_gate_enter() {
  Gate* g = gate();
  long& mine = t_calls;
  // A call inside a call (this thread's fork() waits for the others only) goes in at once.
  while (true) {
    g->calls.fetch_add(1);
    if (mine > 0 || !g->forking.load()) break;
    // A fork waits: out again, tell it, and wait for it to be done.
    g->calls.fetch_sub(1);
    std::unique_lock<std::mutex> lock(g->mu);
    g->cv.notify_all();
    g->cv.wait(lock, [g] { return !g->forking.load(); });
  }
  ++mine;
}

void fork_gate_leave() {
  Gate* g = gate();
  --t_calls;
  g->calls.fetch_sub(1);
  if (g->forking.load()) {  // the fork waits for the count to drop
    std::lock_guard<std::mutex> lock(g->mu);
    g->cv.notify_all();
  }
}

}  // namespace umbp::bindings
