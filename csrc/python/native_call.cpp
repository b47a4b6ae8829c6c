#include "python/native_call.h"

#include <pthread.h>

#include <condition_variable>
#include <mutex>
#include <new>

#include "kernel/memory_lifetimes.h"

namespace umbp::bindings {

namespace {

// The gate: a count of native calls in flight, and whether a fork() is waiting for them. Its
// mutex stays taken from the prepare handler until after the fork; the child, a single thread,
// starts with a new gate (threads waiting in the parent do not exist there).
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  long calls = 0;
  bool forking = false;
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
  g->forking = true;
  g->cv.wait(lock, [g] { return g->calls == t_calls; });
  lock.release();  // held across fork()
}

void parent() {
  Gate* g = gate();
  g->forking = false;
  g->mu.unlock();
  g->cv.notify_all();
}

void child() {
  // Not destroyed: the old condition variable may still count the parent's waiters.
  new (gate()) Gate;
  gate()->calls = t_calls;
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
  std::unique_lock<std::mutex> lock(g->mu);
  g->cv.wait(lock, [g] { return !g->forking || t_calls > 0; });
  ++g->calls;
  ++t_calls;
}

void fork_gate_leave() {
  Gate* g = gate();
  std::lock_guard<std::mutex> lock(g->mu);
  --t_calls;
  --g->calls;
  if (g->forking) g->cv.notify_all();  // the fork waits for the count to drop
}

}  // namespace umbp::bindings
