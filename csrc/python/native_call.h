// A native call from Python: the GIL released for its duration, and fork() held off until it
// returns. Without that, a fork() on one thread while another is inside the allocator or a
// kernel leaves their locks taken in the child for good (a child that allocates then hangs).
// Every GIL-released section of the bindings is a NativeCall.
#pragma once

#include <pybind11/pybind11.h>

namespace umbp::bindings {

// pthread_atfork handlers: fork() waits until no NativeCall is in flight, and none starts
// until it is done. Called once, when the module is imported.
void install_fork_gate();
void fork_gate_enter();
void fork_gate_leave();

class NativeCall {
 public:
  NativeCall() { fork_gate_enter(); }
  ~NativeCall() { fork_gate_leave(); }
  NativeCall(const NativeCall&) = delete;
  NativeCall& operator=(const NativeCall&) = delete;

 private:
  // What pybind11::gil_scoped_release does (without disassoc), minus its get_internals() per
  // call: the module's import made pybind11's internals already.
  struct NoGil {
    NoGil() : tstate(PyEval_SaveThread()) {}
    ~NoGil() { PyEval_RestoreThread(tstate); }
    NoGil(const NoGil&) = delete;
    NoGil& operator=(const NoGil&) = delete;
    PyThreadState* tstate;
  };
  NoGil nogil_;  // released first, taken back last
};

}  // namespace umbp::bindings
