"""A run whose faults cannot fire is its fault-free run: compare takes that run's comparison.

A fault rule answers only a call of its operation. When the run just before a faulted one is
the same run without faults (the same host, work, environment and allocator) and made no call
of any operation the plan's rules name, on either allocator, with its whole trace kept and an
outcome of its own (not a timeout), the faulted run would make the same calls and get the same
answers: SimKernel is deterministic and no rule matches. compare then gives the faulted run that
run's comparison (its differences, both records' lines, where they part) instead of running it
again; the output is the same, byte for byte (tests/external/test_fault_reuse.py checks it run
by run). The full matrix crosses every run with a fault on the first call of each of seven
operations, and a run makes three or four of them: bench/bench_full_matrix.py measures what it
saves.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from umbp_sim.engine.record import RunRecord
from umbp_sim.engine.spec import Run

# Operations every allocator call of which goes through the traced seam (the calls, not the
# page faults of a touch or the reads of /proc and /sys): a rule on one of them that the trace
# does not show never matched.
TRACED_CALLS = frozenset(
    {"mmap", "munmap", "madvise", "mbind", "memfd_create", "ftruncate", "close"}
)
NO_VERDICT = ("timeout", "could-not-run")


def called(record: RunRecord) -> set[str] | None:
    """The operations a run called, or None when its trace is not whole (calls dropped)."""
    if record.trace_dropped:
        return None
    return {line.split("(", 1)[0] for line in record.trace}


def _same_run(run: Run) -> Run:
    return replace(run, plan=None, label="")


class FaultFreeTwin:
    """The last fault-free run's calls and comparison, for the faulted runs that follow it."""

    def __init__(self) -> None:
        self._run: Run | None = None
        self._calls: set[str] = set()
        self._compared: tuple[Any, ...] = ()
        self.reused = 0

    def reuse(self, run: Run) -> tuple[Any, ...] | None:
        """The comparison of ``run`` without running it (``compare.Compared`` without the run),
        when its faults cannot fire; None when it must run."""
        if run.plan is None or self._run is None:
            return None
        ops = {rule.op for rule in run.plan.rules}
        if not ops <= TRACED_CALLS or ops & self._calls or _same_run(run) != self._run:
            return None
        self.reused += 1
        return self._compared

    def ran(self, run: Run, a: RunRecord, b: RunRecord, compared: tuple[Any, ...]) -> None:
        """``run`` ran on both allocators (``compared``: its comparison without the run)."""
        if run.plan is not None:
            return  # a faulted run: the runs after it still follow the fault-free one
        calls_a, calls_b = called(a), called(b)
        if calls_a is None or calls_b is None or a.outcome in NO_VERDICT or b.outcome in NO_VERDICT:
            self._run = None
            return
        self._run, self._calls, self._compared = _same_run(run), calls_a | calls_b, compared
