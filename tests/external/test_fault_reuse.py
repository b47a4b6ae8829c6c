"""compare gives a faulted run whose faults cannot fire its fault-free twin's comparison
(umbp_sim.comparison.fault_reuse): checked here run by run against running it, on the built-in
pair and on an external build, over groups of the full matrix (a fault-free run and the seven
faulted runs after it)."""

from __future__ import annotations

import itertools
from typing import Any

from umbp_sim.allocator_spec import AllocatorSpec, parse_allocator_spec
from umbp_sim.comparison import matrix
from umbp_sim.comparison.differences import compare_run, compared, serial_differences
from umbp_sim.comparison.fault_reuse import FaultFreeTwin
from umbp_sim.engine.spec import Run
from umbp_sim.request import AllocRequest
from umbp_sim.run_router import BuiltinAllocator, open_allocator

GROUP = 1 + len(matrix.FAULTS)  # full(): each run without faults, then one per FAULTS entry


def groups(every: int, count: int) -> list[list[Run]]:
    """``count`` groups of the full matrix, every ``every``-th."""
    runs = matrix.full()
    out = []
    for g in range(count):
        skip = (every - 1) * GROUP if g else 0
        group = list(itertools.islice(runs, skip, skip + GROUP))
        assert group[0].plan is None and all(r.plan is not None for r in group[1:])
        out.append(group)
    return out


def check(a: Any, b: Any, runs: list[list[Run]]) -> tuple[int, int]:
    """(reused, ran) over the faulted runs; each reused comparison is the one running gives."""
    reused = ran = 0
    for group in runs:
        twin = FaultFreeTwin()
        for run in group:
            item = compare_run(run, a, b, twin)
            if twin.reused > reused:
                reused = twin.reused
                assert item[1:] == compared(run, a.run(run), b.run(run))[1:], run.label
            elif run.plan is not None:
                ran += 1
    return reused, ran


def test_a_reused_comparison_is_the_one_running_gives_builtin_pair() -> None:
    a = BuiltinAllocator(AllocatorSpec("builtin", "umbp-sim"))
    b = BuiltinAllocator(AllocatorSpec("builtin", "mori-624002c"))
    reused, ran = check(a, b, groups(every=997, count=24))
    # most runs make three or four of the seven calls; some make none (an early EINVAL)
    assert reused > 0 and ran > 0


def test_a_reused_comparison_is_the_one_running_gives_external_build(
    tiny_builds: dict[str, str],
) -> None:
    a = BuiltinAllocator(AllocatorSpec("builtin", "umbp-sim"))
    b = open_allocator(parse_allocator_spec(tiny_builds["preload"]), {}, 60.0)
    try:
        reused, ran = check(a, b, groups(every=3797, count=6))
    finally:
        b.close()
    assert reused > 0 and ran > 0


def test_a_run_after_a_different_run_or_with_a_called_op_is_not_reused() -> None:
    a = BuiltinAllocator(AllocatorSpec("builtin", "umbp-sim"))
    b = BuiltinAllocator(AllocatorSpec("builtin", "mori-624002c"))
    request = AllocRequest(4 << 20, "Anonymous", numa_node=0, prefault=True)
    base = matrix._run("ample", request)
    faulted = [matrix._run("ample", request, fault=op) for op in matrix.FAULTS]
    twin = FaultFreeTwin()
    compare_run(base, a, b, twin)
    calls = {line.split("(", 1)[0] for line in a.run(base).trace} | {
        line.split("(", 1)[0] for line in b.run(base).trace
    }
    for run in faulted:
        op = run.plan.rules[0].op  # type: ignore[union-attr]
        assert (twin.reuse(run) is None) == (op in calls), run.label
    assert {"mmap", "mbind", "munmap"} <= calls and "memfd_create" not in calls
    other = next(r for r in groups(every=3, count=2)[1] if r.plan is not None)
    assert FaultFreeTwin().reuse(other) is None  # no fault-free run before it
    assert twin.reuse(other) is None  # another host or request


def test_serial_compare_reuses_and_reports_every_run() -> None:
    a = BuiltinAllocator(AllocatorSpec("builtin", "umbp-sim"))
    b = BuiltinAllocator(AllocatorSpec("builtin", "mori-624002c"))
    runs = [r for g in groups(every=1511, count=8) for r in g]
    items = list(serial_differences(a, b, runs))
    assert [i[0].label for i in items] == [r.label for r in runs]
