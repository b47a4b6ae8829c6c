"""The allocator paths that need a hugetlb mapping to succeed first, reached on a SimKernel
(with a small 2 MiB pool) under fault plans: this host has no hugepages."""

from __future__ import annotations

import logging

import pytest

from umbp_sim.allocator import (
    Anonymous,
    AnonymousHugetlb,
    AnonymousShm,
    AnonymousShmHugetlb,
    UMBPHostMemAllocator,
)
from umbp_sim.errors import SimulatedCrash
from umbp_sim.faults import FaultPlan, FaultRule
from umbp_sim.host.leaks import assert_no_leaks, collect_leaks
from umbp_sim.host.trace import instrument
from umbp_sim.machine import Machine
from umbp_sim.sim import SimHost, build_kernel

MiB = 1 << 20


@pytest.fixture
def sim(caplog):
    caplog.set_level(logging.INFO, logger="umbp_sim.allocator")

    def make(*rules, machine=None):
        m = machine or Machine.x86_64(hugepages={"2MiB": 4})
        host = SimHost(m, build_kernel(m))
        st = instrument(host.kernel, FaultPlan(tuple(rules)))
        alloc = UMBPHostMemAllocator(st.kernel)
        warnings = lambda: [  # noqa: E731
            r.getMessage() for r in caplog.records if r.name == "umbp_sim.allocator"
        ]
        return host, st, alloc, warnings

    return make


@pytest.mark.parametrize(
    "backing, to", [(AnonymousHugetlb, Anonymous), (AnonymousShmHugetlb, AnonymousShm)]
)
def test_populate_efault_on_hugetlb_unmaps_and_demotes(sim, backing, to):
    host, st, alloc, warnings = sim(FaultRule(op="madvise", errno="EFAULT", nth=1))
    h = alloc.alloc(4 * MiB, backing)
    assert h and h.actual_backing == to and h.mapped_size == 4 * MiB
    # Counters are read before the hugetlb mapping is unmapped: its 2 pages are still reserved.
    assert warnings() == [
        "MADV_POPULATE_WRITE of 4194304 bytes (2048 kB pages) failed: EFAULT (no free hugepage "
        "on the allowed nodes); HugePages of 2048 kB: free 4, total 4, reserved 2; unmapped, "
        f"falling back to 4 KiB pages ({to.name})"
    ]
    assert host.hugepages().reserved == 0  # the hugetlb attempt gave its reservation back
    alloc.free(h)
    assert_no_leaks(st.kernel, alloc, host)


def test_populate_enomem_on_hugetlb_is_an_invalid_handle(sim):
    host, st, alloc, warnings = sim(FaultRule(op="madvise", errno="ENOMEM"))
    assert not alloc.alloc(2 * MiB, AnonymousHugetlb)
    assert warnings() == [
        "MADV_POPULATE_WRITE of 2097152 bytes (AnonymousHugetlb, 2048 kB pages) failed: ENOMEM; "
        "unmapped, returning an invalid handle"
    ]
    assert collect_leaks(st.kernel, alloc, host) == []


def test_touch_fallback_strides_by_the_hugepage(sim):
    host, st, alloc, warnings = sim(FaultRule(op="madvise", errno="EINVAL"))
    h = alloc.alloc(4 * MiB, AnonymousHugetlb)
    assert h.actual_backing == AnonymousHugetlb and h.actual_alignment == 2 * MiB
    (t,) = [r for r in st.tracing.records() if r.op == "touch"]
    assert t.text() == f"touch({h.ptr:#x}, 4194304, 2097152) = 0"
    assert host.hugepages().free == 2  # the touch faulted two pages in
    alloc.free(h)
    assert_no_leaks(st.kernel, alloc, host)


def test_efault_cleanup_crash(sim):
    host, st, alloc, warnings = sim(
        FaultRule(op="madvise", errno="EFAULT"), FaultRule(op="munmap", signal="SIGKILL")
    )
    with pytest.raises(SimulatedCrash, match="^killed by SIGKILL during munmap$"):
        alloc.alloc(2 * MiB, AnonymousHugetlb)


def test_bound_to_a_node_without_pages_on_the_simulated_kernel(sim):
    # No injected fault: SimKernel itself answers POPULATE_WRITE with EFAULT (pages only on node 1).
    m = Machine.x86_64(nodes=2, hugepages_per_node=[{}, {"2MiB": 4}])
    host, st, alloc, warnings = sim(machine=m)
    h = alloc.alloc(2 * MiB, AnonymousHugetlb, numa_node=0)
    assert h.actual_backing == Anonymous and h.numa_node == 0
    assert warnings() == [
        "MADV_POPULATE_WRITE of 2097152 bytes (2048 kB pages) failed: EFAULT (no free hugepage "
        "on the allowed nodes); HugePages of 2048 kB: free 4, total 4, reserved 1; unmapped, "
        "falling back to 4 KiB pages (Anonymous)"
    ]
    assert not any(r.injected for r in st.tracing.records())
    alloc.free(h)
    assert_no_leaks(st.kernel, alloc, host)


def test_touch_sigbus_from_the_simulated_kernel_with_a_plan(sim):
    # Old-kernel behaviour by plan (POPULATE_WRITE -> EINVAL), SIGBUS by the simulated kernel.
    m = Machine.x86_64(nodes=2, hugepages_per_node=[{}, {"2MiB": 4}])
    host, st, alloc, warnings = sim(FaultRule(op="madvise", errno="EINVAL"), machine=m)
    with pytest.raises(SimulatedCrash) as info:
        alloc.alloc(2 * MiB, AnonymousHugetlb, numa_node=0)
    # The wrappers pass crash_info() down to the SimKernel that decided the crash.
    assert (info.value.signal, info.value.where) == ("SIGBUS", "prefault touch")
    assert (info.value.node, info.value.hugepage_size) == (0, 2 * MiB)
    assert st.kernel.crash_info() == host.kernel.crash_info() != None  # noqa: E711
    assert st.faulty.crash_info() == host.kernel.crash_info()
    last = st.tracing.records()[-1]
    assert last.text() == (
        f"touch({last.args['addr']:#x}, 2097152, 2097152) = ? +++ killed by SIGBUS +++"
    )
    assert not last.injected


def test_efault_counters_that_throw_leave_an_empty_counter_text(sim):
    host, st, alloc, warnings = sim(
        FaultRule(op="madvise", errno="EFAULT", nth=1),
        FaultRule(op="read_file", throw="bad_alloc", nth=1),
    )
    h = alloc.alloc(2 * MiB, AnonymousHugetlb)
    assert h.actual_backing == Anonymous
    assert warnings() == [
        "MADV_POPULATE_WRITE of 2097152 bytes (2048 kB pages) failed: EFAULT (no free hugepage "
        "on the allowed nodes); ; unmapped, falling back to 4 KiB pages (Anonymous)"
    ]
    alloc.free(h)
    assert_no_leaks(st.kernel, alloc, host)
