"""The pytest plugin's fixtures for hand-written tests: sim_host, fault_plan, umbp_allocator."""

from __future__ import annotations

import errno
from typing import Any

import pytest

import umbp_sim
from umbp_sim import UMBPHostBufferBacking as B

pytestmark = pytest.mark.machine(nodes=2, hugepages_per_node=[{"2MiB": 8}, {"2MiB": 0}])


def test_umbp_allocator_runs_on_sim_host(umbp_allocator: Any, sim_host: umbp_sim.SimHost) -> None:
    h = umbp_allocator.alloc(4 << 20, B.AnonymousHugetlb, numa_node=0)
    assert h.actual_backing == B.AnonymousHugetlb
    assert sim_host.node_hugepages(0, 2 << 20).free == 6  # prefaulted on node 0
    with open("/proc/meminfo") as f:  # the fake /proc says the same
        assert "HugePages_Free:        6\n" in f.read()
    umbp_allocator.free(h)
    assert sim_host.hugepages(2 << 20).free == 8


def test_fault_plan_factory_wraps_any_kernel(fault_plan: Any, sim_host: umbp_sim.SimHost) -> None:
    plan = fault_plan({"op": "mmap", "errno": "ENOMEM", "nth": 1}, seed=3)
    assert plan.seed == 3 and len(plan.rules) == 1
    k = plan.wrap(sim_host.kernel)
    c = umbp_sim._native.constants
    first = k.mmap(0, 4096, c["PROT_READ"], c["MAP_PRIVATE"] | c["MAP_ANONYMOUS"])
    second = k.mmap(0, 4096, c["PROT_READ"], c["MAP_PRIVATE"] | c["MAP_ANONYMOUS"])
    assert first.error == errno.ENOMEM and second.ok
    assert k.munmap(second.value, 4096).ok


def test_umbp_allocator_teardown_reports_leaks(pytester: pytest.Pytester) -> None:
    # A test that forgets to free fails at teardown, naming what it left.
    pytester.makepyfile(
        """
        from umbp_sim import UMBPHostBufferBacking as B

        def test_forgets(umbp_allocator):
            umbp_allocator.alloc(8192, B.Anonymous)
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*leaked*buffer 0x* (8192 bytes, Anonymous) not freed*"])
