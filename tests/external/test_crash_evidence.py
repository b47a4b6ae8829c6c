"""A simulated death of an external build reads as the built-in allocator's: the interposer's
post-mortem (the C ABI's JSON, SimKernel's crash record by its declared fields) read back as
``KernelCrash`` and turned into the run's error by those fields (tests/test_crash_record.py)."""

from __future__ import annotations

from umbp_sim.allocator_spec import parse_allocator_spec
from umbp_sim.comparison.matrix import machine
from umbp_sim.engine.record import RunRecord
from umbp_sim.engine.spec import Alloc, Run
from umbp_sim.request import AllocRequest
from umbp_sim.run_router import open_allocator, run


def _on(path: str, r: Run) -> RunRecord:
    opened = open_allocator(parse_allocator_spec(path))
    try:
        return opened.run(r)
    finally:
        opened.close()


def test_an_external_builds_death_says_what_the_builtin_allocators_says(
    tiny_builds: dict[str, str],
) -> None:
    # 2 MiB pages on node 0 only: a hugetlb buffer bound to node 1 dies of SIGBUS when touched.
    r = Run(machine("pool-on-node0"), Alloc(AllocRequest(4 << 20, "AnonymousHugetlb", numa_node=1)))
    builtin, external = run(r), _on(tiny_builds["wrap"], r)
    assert (builtin.outcome, external.outcome) == ("crashed", "crashed")
    assert (external.signal, external.crash_node, external.simulated) == ("SIGBUS", 1, True)
    assert (builtin.signal, builtin.crash_node) == ("SIGBUS", 1)
    assert external.error == builtin.error
    assert external.error.startswith("killed by SIGBUS during prefault touch of node 1 (2048 kB ")
