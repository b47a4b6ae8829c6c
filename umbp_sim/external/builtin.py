"""A ``Run`` on umbp-sim's own allocator, in this process: the reference side of ``compare``."""

from __future__ import annotations

import logging
from typing import Any

from umbp_sim import _native
from umbp_sim.allocator import UMBPHostBufferBacking, UMBPHostMemAllocator
from umbp_sim.errors import SimulatedCrash
from umbp_sim.external.binding import binding, pools_free
from umbp_sim.external.outcome import Outcome, Run
from umbp_sim.log_capture import LogCapture
from umbp_sim.machine import Machine
from umbp_sim.outcome import handle_fields
from umbp_sim.sim import to_sim_config
from umbp_sim.trace import instrument

_LOGGERS = ("umbp_sim.allocator",)

# SimConfig by Machine object: building it is most of a built-in run's cost, and compare's runs
# share a few machines (the matrix's are cached, never changed). SimKernel copies the config.
_CONFIGS: dict[int, tuple[Machine, Any]] = {}


def _kernel(machine: Machine) -> Any:
    """A fresh SimKernel in ``machine``'s state."""
    hit = _CONFIGS.get(id(machine))
    if hit is None or hit[0] is not machine:
        if len(_CONFIGS) >= 256:
            _CONFIGS.clear()
        hit = _CONFIGS[id(machine)] = (machine, to_sim_config(machine))
    return _native.SimKernel(hit[1])


def make_allocator(kernel: Any, profile: str) -> UMBPHostMemAllocator:
    """The built-in allocator with a policy profile (``umbp_sim.profiles``)."""
    return UMBPHostMemAllocator(kernel=kernel, profile=profile)


def run_builtin(run: Run, profile: str = "umbp-sim") -> Outcome:
    """One run of the built-in allocator on a fresh simulated host."""
    kernel = _kernel(run.machine)
    stack = instrument(kernel, run.plan)
    before = pools_free(kernel, run.machine)
    collect = LogCapture()
    loggers = [logging.getLogger(n) for n in _LOGGERS]
    for log in loggers:
        log.addHandler(collect)
    stage = "alloc"
    out = Outcome(result="invalid")
    try:
        allocator = make_allocator(stack.kernel, profile)
        c = run.call
        try:
            h = allocator.alloc(
                c.size, getattr(UMBPHostBufferBacking, c.backing), c.hugepage_size,
                c.numa_node, c.prefault,
            )  # fmt: skip
        except SimulatedCrash:
            raise
        except Exception as e:  # noqa: BLE001 - the allocator's exception is the outcome
            out.result = "error"
            out.error = f"{type(e).__name__}: {e}"
            h = None
        if h is not None:
            out.handle = handle_fields(h)
            out.result = "ok" if h else "invalid"
            if run.write and h:
                stage = "write"
                r = stack.kernel.touch(int(h.ptr), 1, 1)
                if r.signal:
                    raise SimulatedCrash(_sig(r.signal), "user write")
            if h:
                out.binding = binding(kernel, run.machine, int(h.ptr), before)
            if run.free:
                stage = "free"
                allocator.free(h)
                out.free_ok = True
    except SimulatedCrash as e:
        out.result = "crash"
        out.crash = {"signal": e.signal, "stage": stage, "simulated": True, "detail": e.detail}
    finally:
        for log in loggers:
            log.removeHandler(collect)
    out.warnings = list(collect.messages)
    out.trace = [r.text() for r in stack.tracing.records()]
    if out.result != "crash":  # a dead process leaks nothing
        out.leaks = {
            "mappings": len(stack.tracing.live_mappings()),
            "fds": len(stack.tracing.open_fds()),
        }
    return out


def _sig(num: int) -> str:
    import signal

    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"
