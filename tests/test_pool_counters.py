"""A hugepage pool's counters are declared once (UMBP_SIM_HUGEPAGE_COUNTERS in
csrc/kernel/sim_kernel.h, ``_native.HUGEPAGE_COUNTERS``): ``HugePages``' fields are those names
in that order, SimKernel hands them in it (the same numbers its /proc/meminfo shows), and a
scenario's ``[expect].counters`` keys name exactly those fields."""

from __future__ import annotations

import dataclasses

import pytest

from umbp_sim import Machine, _native
from umbp_sim.allocator import UMBPHostBufferBacking, UMBPHostMemAllocator
from umbp_sim.engine.counters import read_counters
from umbp_sim.engine.spec import RunError
from umbp_sim.explore.model import AllocatorModel
from umbp_sim.sim import HugePages, SimHost

MiB = 1 << 20


@pytest.fixture
def host() -> SimHost:
    # 6 pages of 2 MiB; 2 faulted in, 2 more reserved: total 6, free 4, reserved 2, surplus 0
    # (four different numbers, so a counter read in the wrong place shows).
    h = SimHost(Machine.x86_64(nodes=2, mem_per_node="8GiB"))
    h.set_nr_hugepages(2 * MiB, 6)
    a = UMBPHostMemAllocator(kernel=h.kernel)
    assert a.alloc(4 * MiB, UMBPHostBufferBacking.AnonymousHugetlb, 2 * MiB, -1, True)
    assert a.alloc(4 * MiB, UMBPHostBufferBacking.AnonymousHugetlb, 2 * MiB, -1, False)
    return h


def test_hugepages_fields_are_the_declared_counters() -> None:
    assert tuple(f.name for f in dataclasses.fields(HugePages)) == _native.HUGEPAGE_COUNTERS


def test_the_counters_come_in_their_declared_order(host: SimHost) -> None:
    got = host.hugepages(2 * MiB)
    info = host.meminfo()
    assert got == HugePages(total=6, free=4, reserved=2, surplus=0)
    assert dataclasses.astuple(got) == (
        info["HugePages_Total"], info["HugePages_Free"], info["HugePages_Rsvd"],
        info["HugePages_Surp"],
    )  # fmt: skip
    nodes = [host.node_hugepages(n, 2 * MiB) for n in (0, 1)]
    assert sum(n.total for n in nodes) == 6 and {n.reserved for n in nodes} == {0}


def test_a_scenario_names_each_declared_counter_and_no_other(host: SimHost) -> None:
    keys = [f"hugepages.2MiB.{name}" for name in _native.HUGEPAGE_COUNTERS]
    assert read_counters(host, keys) == dict(zip(keys, (6, 4, 2, 0), strict=True))
    with pytest.raises(RunError, match=r"^\[expect\]\.counters\.hugepages\.2MiB\.rsvd: no such"):
        read_counters(host, ["hugepages.2MiB.rsvd"])


def test_the_reference_model_answers_in_the_same_record() -> None:
    m = Machine.x86_64(nodes=2, mem_per_node="8GiB")
    model = AllocatorModel(m)
    assert isinstance(model.counters(2 * MiB), HugePages)
    assert model.counters(2 * MiB) == SimHost(m).hugepages(2 * MiB)
