"""The allocator on random simulated hosts against the reference model (umbp_sim.explore).

The state machine lives in umbp_sim/explore/stateful.py; the profile (HYPOTHESIS_PROFILE=ci |
deep) sets how many schedules and how long. Below it, the model is pinned to the worked
examples of docs/kernel-model.md so that a model bug cannot hide behind the simulator.
"""

from __future__ import annotations

from umbp_sim.explore import hypothesis_profiles as profiles
from umbp_sim.explore.model import AllocatorModel
from umbp_sim.explore.stateful import AllocatorStateMachine
from umbp_sim.machine import Machine, MiB
from umbp_sim.sim import HugePages

TestAllocatorStateMachine = AllocatorStateMachine.TestCase
TestAllocatorStateMachine.settings = profiles.active()

HP = 2 * MiB


def test_model_reservation_experiment_of_section_1() -> None:
    # Pool of 4 x 2 MiB: 3 pages reserve, 2 more cannot, len=1 takes the last one.
    m = AllocatorModel(Machine.x86_64(hugepages={"2MiB": 4}))
    a = m.alloc("a", 3 * HP, "AnonymousHugetlb", HP, -1, False)
    assert (a.outcome, a.backing, a.mapped_size) == ("ok", "AnonymousHugetlb", 3 * HP)
    assert m.counters(HP) == HugePages(total=4, free=4, reserved=3, surplus=0)
    b = m.alloc("b", 2 * HP, "AnonymousHugetlb", HP, -1, False)
    assert (b.outcome, b.backing, b.mapped_size) == ("demoted", "Anonymous", 2 * HP)
    c = m.alloc("c", 1, "AnonymousHugetlb", HP, -1, True)
    assert (c.outcome, c.mapped_size) == ("ok", HP)
    assert m.counters(HP) == HugePages(total=4, free=3, reserved=3, surplus=0)
    assert m.free("a") == "freed"
    assert m.counters(HP) == HugePages(total=4, free=3, reserved=0, surplus=0)


def test_model_surplus_and_shrink_caveat() -> None:
    # Lowering nr_hugepages below the pages in use turns them into surplus (section 1 caveat).
    m = AllocatorModel(Machine.x86_64(hugepages={"2MiB": 4}))
    m.alloc("a", 2 * HP, "AnonymousHugetlb", HP, -1, True)  # 2 faulted
    m.alloc("b", HP, "AnonymousHugetlb", HP, -1, False)  # 1 reserved
    m.set_nr_hugepages(HP, 1)
    assert m.counters(HP) == HugePages(total=3, free=1, reserved=1, surplus=2)
    m.free("a")
    m.free("b")
    assert m.counters(HP) == HugePages(total=1, free=1, reserved=0, surplus=0)


def test_model_bound_node_without_pages_demotes_or_crashes() -> None:
    pools = [{"2MiB": 4}, {}]
    new = AllocatorModel(Machine.x86_64(nodes=2, hugepages_per_node=pools))
    p = new.alloc("a", 4 * HP, "AnonymousHugetlb", HP, 1, True)
    assert (p.outcome, p.backing) == ("demoted", "Anonymous")
    assert new.counters(HP) == HugePages(total=4, free=4, reserved=0, surplus=0)
    old = AllocatorModel(Machine.x86_64(nodes=2, hugepages_per_node=pools, kernel_version="5.10.0"))
    p = old.alloc("a", 4 * HP, "AnonymousHugetlb", HP, 1, True)
    assert (p.outcome, p.crash_node) == ("crashed", 1)
    assert old.dead


def test_model_shm_deferred_free() -> None:
    m = AllocatorModel(Machine.x86_64())
    m.alloc("s", 4096, "AnonymousShm", HP, -1, True)
    m.set_base("s", 0x7F0000000000)
    assert not m.acquire(0x7F0000000000 + 4095, 2)  # runs past the end
    assert m.acquire(0x7F0000000000, 4096)
    assert m.free("s") == "deferred"
    assert not m.lookup(0x7F0000000000, 1)
    assert m.release(0x7F0000001000) == "ignored"
    assert m.release(0x7F0000000000) == "unmapped"
    assert m.buffers == {}
