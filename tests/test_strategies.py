"""umbp_sim.strategies: every machine validates and renders, pins hold, shrinking is plain."""

from __future__ import annotations

import pytest
from hypothesis import find, given, strategies as st

from umbp_sim.allocator import UMBPHostMemAllocator
from umbp_sim.explore import hypothesis_profiles as profiles
from umbp_sim.faults import FaultPlan
from umbp_sim.machine import GiB, KiB, Machine, MiB
from umbp_sim.sim import SimHost
from umbp_sim.strategies import (
    KERNEL_VERSIONS,
    AllocRequest,
    alloc_requests,
    fault_plans,
    machines,
)

SETTINGS = profiles.active(max_examples=profiles.examples(40, 500))


@SETTINGS
@given(machines())
def test_every_machine_validates_and_renders(machine: Machine) -> None:
    assert machine.validate() is machine
    host = SimHost(machine)
    files = host.files()
    assert files
    assert "/proc/meminfo" in files
    for size in machine.hugepage_sizes:
        assert host.hugepages(size).total == machine.pool_total(size)
    assert 1 <= len(machine.nodes) <= 4


@SETTINGS
@given(machines(nodes=2, kernel_version="6.18.0", preset="arm64-64k"))
def test_pins_hold(machine: Machine) -> None:
    assert len(machine.nodes) == 2
    assert machine.kernel_version == "6.18.0"
    assert (machine.arch, machine.page_size) == ("arm64", 64 * KiB)
    assert machine.hugepage_sizes == [2 * MiB, 512 * MiB, 16 * GiB]


@SETTINGS
@given(machines(nodes=st.integers(3, 4), kernel_version=st.sampled_from(["5.13.0", "5.14.0"])))
def test_pins_take_strategies(machine: Machine) -> None:
    assert len(machine.nodes) in (3, 4)
    assert machine.kernel_version in ("5.13.0", "5.14.0")


@SETTINGS
@given(
    machines(
        admin_reserve_kbytes=0,
        user_reserve_kbytes=st.sampled_from([0, 4096]),
        swap_total=GiB,
        root=False,
        watermark_low=st.just(MiB),
    )
)
def test_any_declared_field_can_be_pinned(machine: Machine) -> None:
    assert (machine.admin_reserve_kbytes, machine.swap_total) == (0, GiB)
    assert machine.user_reserve_kbytes in (0, 4096)
    assert (machine.root, machine.watermark_low) == (False, MiB)


def test_the_fields_the_preset_decides_are_not_pins() -> None:
    for key in ("arch", "page_size", "hugepage_sizes", "default_hugepage_size", "hugepages"):
        with pytest.raises(TypeError, match=rf"unknown keyword\(s\) \['{key}'\]"):
            machines(**{key: None})


def test_pins_are_checked() -> None:
    with pytest.raises(TypeError, match=r"machines\(\): unknown keyword\(s\) \['node'\]"):
        machines(node=2)
    with pytest.raises(ValueError, match="machines\\(preset=...\\): one of"):
        machines(preset="sparc")


def test_machines_shrink_to_a_plain_host() -> None:
    m = find(machines(), lambda m: True)
    assert (m.arch, m.page_size, len(m.nodes), m.kernel_version) == ("x86_64", 4096, 1, "6.18.0")
    assert m.pool_total(2 * MiB) == m.pool_total(GiB) == 0
    assert (m.nr_overcommit_hugepages, m.overcommit_memory, m.rlimit_as, m.memcg_max) == (
        {}, 0, None, None)  # fmt: skip
    two = find(machines(), lambda m: len(m.nodes) >= 2 and m.pool_total(2 * MiB) > 0)
    assert len(two.nodes) == 2 and two.pool_total(2 * MiB) == 1
    assert two.kernel_version == "6.18.0" and two.arch == "x86_64"


def test_kernel_versions_span_the_feature_boundaries() -> None:
    assert KERNEL_VERSIONS[0] == "6.18.0"
    assert {"3.10.0", "4.13.0", "4.14.0", "5.13.0", "5.14.0", "6.18.0"} <= set(KERNEL_VERSIONS)
    m = find(machines(), lambda m: m.page_size == 16 * KiB)
    assert m.hugepage_sizes == [2 * MiB, 32 * MiB, GiB] and m.default_hugepage_size == 32 * MiB


@SETTINGS
@given(fault_plans(fatal=True, max_rules=4))
def test_fault_plans_validate_and_round_trip(plan: FaultPlan) -> None:
    again = FaultPlan.from_toml(plan.to_toml())
    assert again == plan
    assert len(plan.native_rules()) == len(plan.rules)


def test_fault_plans_shrink_to_empty_and_respect_ops() -> None:
    assert find(fault_plans(), lambda p: True).rules == ()
    plan = find(fault_plans(ops=["mbind"]), lambda p: len(p.rules) >= 2)
    assert [r.op for r in plan.rules] == ["mbind", "mbind"]
    assert all(r.errno is not None for r in plan.rules)
    with pytest.raises(ValueError, match="unknown operation"):
        fault_plans(ops=["mmap", "fork"])


@SETTINGS
@given(machines(), st.data())
def test_alloc_requests_are_accepted_by_the_allocator(machine: Machine, data) -> None:  # type: ignore[no-untyped-def]
    req = data.draw(alloc_requests(machine.hugepage_sizes, nodes=len(machine.nodes)))
    assert isinstance(req, AllocRequest)
    host = SimHost(machine)
    allocator = UMBPHostMemAllocator(kernel=host.kernel)
    try:
        h = allocator.alloc(*req.args())
    except Exception as e:  # a simulated crash is a result; a TypeError is not
        assert type(e).__name__ == "SimulatedCrash", e
        return
    if h:
        assert h.requested_size == req.size
        allocator.free(h)
    assert host.mappings() == []


def test_alloc_requests_shrink_to_one_plain_byte() -> None:
    req = find(alloc_requests(), lambda r: True)
    assert req == AllocRequest(1, "Anonymous", 2 * MiB, -1, False)
    assert req.table() == {"size": 1, "backing": "Anonymous", "hugepage_size": 2 * MiB,
                           "numa_node": -1, "prefault": False}  # fmt: skip
