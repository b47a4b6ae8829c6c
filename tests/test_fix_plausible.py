"""Fixes a person would take: the host's own hugepage size with a pool for it before giving up
hugepages, the margin each fix leaves on the buffer's node, and "does not help" kept to what a
person would plausibly try (docs/field-failures.md; umbp_sim/diagnose/fix_search.py, margin.py)."""

from __future__ import annotations

from umbp_sim.diagnose import diagnose
from umbp_sim.diagnose.fixes import candidates
from umbp_sim.diagnose.replay_request import Request
from umbp_sim.diagnose.report import render_text
from umbp_sim.diagnose.simulate import simulate_request
from umbp_sim.machine import Machine
from umbp_sim.request import AllocRequest

GiB, MiB = 1 << 30, 1 << 20


def hugetlb(size: int, node: int = -1, page: int = 2 * MiB) -> Request:
    return Request(AllocRequest(size, "AnonymousHugetlb", page, node, True))


def test_a_host_without_the_asked_size_is_offered_its_own_size_and_a_pool() -> None:
    # POWER with a hash MMU: 16 MiB and 16 GiB pages, no 2 MiB; 100 of 16 MiB reserved.
    power = Machine.ppc64le(mmu="hash", nodes=2, mem_per_node="64GiB", hugepages={"16MiB": 100})
    d = diagnose(power, None, hugetlb(8 * GiB))
    assert d.run.outcome == "demoted"
    first = d.fixes[0]
    assert first.commands == ["--hugepage-size 16MiB", "sysctl -w vm.nr_hugepages=512"]
    assert first.outcome_after == "ok: AnonymousHugetlb"
    every = [c for f in d.fixes for c in f.commands]
    assert "--backing anonymous" not in every  # giving up hugepages: only when nothing else does
    assert "--hugepage-size 16GiB" not in every  # a 16 GiB page for an 8 GiB buffer


def test_each_fix_says_what_it_leaves_on_the_node() -> None:
    small = Machine.x86_64(nodes=2, mem_per_node="4GiB")
    d = diagnose(small, None, hugetlb(3584 * MiB, node=1))
    grow = d.fixes[0]
    assert grow.commands == [
        "echo 1792 > /sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages"
    ]
    text = render_text(d)
    leaves = "node 1: 512 MiB of memory free or reclaimable (under 1 GiB), 0 free 2MiB pages"
    assert f"      leaves: {leaves}" in text
    assert d.to_json()["fixes"][0]["margin"] == leaves
    roomy = Machine.x86_64(nodes=2, mem_per_node="64GiB")
    fixed = diagnose(roomy, None, hugetlb(3584 * MiB, node=1)).fixes[0]
    assert fixed.run is not None
    from umbp_sim.diagnose.margin import margin

    assert margin(fixed.run) == (
        "node 1: 60.5 GiB of memory free or reclaimable, 0 free 2MiB pages"
    )


def test_does_not_help_leaves_out_compromises_that_change_nothing() -> None:
    bare = Machine.x86_64(nodes=2, mem_per_node="4GiB")  # no hugepages anywhere
    d = diagnose(bare, None, hugetlb(3584 * MiB, node=1))
    tried = [c for f in d.not_helping for c in f.commands]
    assert "--numa-node 0" not in tried  # 0 free pages there: demoted as before
    assert "--hugepage-size 1GiB" not in tried  # no 1 GiB pool either: demoted as before
    # Changes to the host stay, with what they do instead.
    assert "sysctl -w vm.nr_hugepages=1792" in tried
    (grow,) = [f for f in d.not_helping if f.commands == ["sysctl -w vm.nr_hugepages=1792"]]
    assert grow.outcome_after.startswith("crashed: killed by SIGBUS")


def test_no_tiny_hugepages_for_a_large_buffer() -> None:
    arm = Machine.arm64(nodes=2, mem_per_node="128GiB")  # 4 KiB base: 64K, 2M, 32M, 1G
    assert 64 * 1024 in arm.hugepage_sizes
    request = hugetlb(93 * GiB)
    offered = [
        c
        for f in candidates(arm, request, simulate_request(arm, request))
        for c in f.commands
        if c.startswith("--hugepage-size")
    ]
    assert offered == ["--hugepage-size 32MiB", "--hugepage-size 1GiB"]


def test_a_buffer_below_every_other_size_is_offered_the_next_one_up() -> None:
    """POWER's smallest hugepage is 16 MiB: a 10 MiB buffer asking for 2 MiB pages is offered
    one 16 MiB page (at most twice the buffer), never the 16 GiB one."""
    power = Machine.ppc64le(mmu="hash", nodes=2, mem_per_node="64GiB", hugepages={"16MiB": 4})
    request = hugetlb(10 * MiB)
    offered = [
        c
        for f in candidates(power, request, simulate_request(power, request))
        for c in f.commands
        if c.startswith("--hugepage-size")
    ]
    assert offered == ["--hugepage-size 16MiB"]
    small = hugetlb(4 * MiB)  # 16 MiB is four times the buffer: not a size to offer
    offered = [
        c
        for f in candidates(power, small, simulate_request(power, small))
        for c in f.commands
        if c.startswith("--hugepage-size")
    ]
    assert offered == []
