"""Every Linux rule lives in SimKernel (issue 25, item 4; ARCHITECTURE.md "Where each rule
lives"): MemAvailable, each node's free memory, CommitLimit and the ratio that gives one, the
low watermarks of min_free_kbytes and the round robin of new hugepages over nodes are computed
by csrc/kernel/sim_rules.h, and Python reads them back.

The first tests mark each native rule (a patched entry point that answers differently) and
check that every Python place that shows the number shows the mark: a Python formula added
back beside the kernel's would show the old number and fail. The others check that the
numbers Python is given before a SimKernel exists are the ones a SimKernel shows, and that
the rules still give what the Python formulas they replaced gave.
"""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from umbp_sim import _native
from umbp_sim.diagnose import diagnose
from umbp_sim.diagnose.picture import picture
from umbp_sim.diagnose.replay_request import Request
from umbp_sim.dump import load_dump
from umbp_sim.dump.parse import parse_node_meminfo
from umbp_sim.dump.read_pools import spread
from umbp_sim.machine import GiB, Machine, MiB, Node
from umbp_sim.request import AllocRequest
from umbp_sim.sim import SimHost, start_numbers
from umbp_sim.strategies import machines

# ---- a marked rule shows up wherever Python shows the number ---------------------------------


def _marked(name: str, mark: Any) -> Any:
    real = getattr(_native, name)
    return lambda *a: mark(real(*a))


def _render(m: Machine, root: Path, drop: tuple[str, ...] = ()) -> Path:
    SimHost(m).render(root)
    for rel in drop:
        (root / rel).unlink()
    return root


def test_the_round_robin_of_new_pages_is_the_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_native, "interleave", _marked("interleave", lambda s: s[::-1]))
    m = Machine.x86_64(nodes=2, hugepages={"2MiB": 3})
    assert [n.hugepages[2 * MiB].total for n in m.nodes] == [1, 2]  # the kernel's would be 2, 1
    assert spread(1001, 2) == [500, 501]


def test_start_numbers_are_the_kernels(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def mark(d: dict) -> dict:
        nodes = [{**n, "mem_free": n["mem_free"] - 3 * MiB} for n in d["nodes"]]
        return {**d, "mem_free": d["mem_free"] - 3 * MiB, "mem_available": 1234 * MiB,
                "nodes": nodes}  # fmt: skip

    monkeypatch.setattr(_native, "host_numbers", _marked("host_numbers", mark))
    m = Machine.x86_64(nodes=2, mem_per_node="8GiB", page_cache=2 * GiB)
    pic = picture(m, [1 << 20], "Anonymous", 2 * MiB, 0, "ok")
    assert [n.mem_free for n in pic.nodes] == [7 * GiB - 3 * MiB] * 2
    # a dump without MemAvailable: the reader's estimate is the kernel's
    m.mem_available_line = False
    loaded, facts = load_dump(_render(m, tmp_path / "d"))
    assert loaded.mem_available == 1234 * MiB
    (note,) = [n for n in facts.notes if "(si_mem_available) at " in n]
    assert f"at {1234 * 1024} kB from MemFree {(14 * GiB - 3 * MiB) // 1024} kB" in note


def test_default_watermarks_are_the_kernels(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(_native, "default_watermark_low", _marked("default_watermark_low",
                                                                  lambda v: v + 4096))  # fmt: skip
    monkeypatch.setattr(
        _native,
        "watermark_low_from_min_free_kbytes",
        _marked("watermark_low_from_min_free_kbytes", lambda v: v + 8192),
    )
    m = Machine.x86_64(mem_available_line=False)
    no_zones = _render(m, tmp_path / "a", drop=("proc/zoneinfo",))
    # min_free_kbytes 16384 for 16 GiB, low = 5/4 of it
    assert load_dump(no_zones)[0].watermark_low == 20 * MiB + 4096
    (no_zones / "proc/sys/vm/min_free_kbytes").write_text("67584\n")
    assert load_dump(no_zones)[0].watermark_low == 67584 * 1280 + 8192


def test_commit_limit_solved_and_raised_by_the_kernel(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(_native, "solve_overcommit_ratio", _marked("solve_overcommit_ratio",
                                                                   lambda r: r + 7))  # fmt: skip
    monkeypatch.setattr(_native, "overcommit_ratio_for", _marked("overcommit_ratio_for",
                                                                 lambda r: r + 3))  # fmt: skip
    m = Machine.x86_64(overcommit_ratio=60)
    no_ratio = _render(m, tmp_path / "d", drop=("proc/sys/vm/overcommit_ratio",))
    loaded, facts = load_dump(no_ratio)
    assert loaded.overcommit_ratio == 67
    assert "overcommit_ratio 67: solved from CommitLimit" in facts.notes
    strict = Machine.x86_64(mem_per_node="16GiB", overcommit_memory=2)
    d = diagnose(strict, None, Request(AllocRequest(12 << 30, "Anonymous")))
    assert any(f.commands == ["sysctl -w vm.overcommit_ratio=79"] for f in d.fixes)


# ---- the numbers given before a SimKernel exists are a SimKernel's ---------------------------


def _shown(host: SimHost) -> dict[str, Any]:
    """What the simulated host's files say: meminfo's lines and each node's MemFree (kB)."""
    mi = host.meminfo()
    out: dict[str, Any] = {
        "mem_free": mi["MemFree"],
        "mem_available": mi.get("MemAvailable"),
        "commit_limit": mi["CommitLimit"],
        "nodes": {},
    }
    if host.machine.numa_sysfs:
        for n in host.machine.nodes:
            v = parse_node_meminfo(host.read(f"/sys/devices/system/node/node{n.id}/meminfo"), n.id)
            out["nodes"][n.id] = (v["MemFree"], v["Inactive(file)"], v["SReclaimable"])
    return out


@settings(max_examples=60, deadline=None)
@given(machines())
def test_start_numbers_are_what_a_simkernel_shows(m: Machine) -> None:
    host = SimHost(m)
    start = start_numbers(m)
    now = host.numbers()
    assert (start.mem_free, start.mem_available, start.commit_limit) == (
        now.mem_free, now.mem_available, now.commit_limit)  # fmt: skip
    assert sorted(start.nodes, key=lambda n: n.id) == sorted(now.nodes, key=lambda n: n.id)
    shown = _shown(host)
    assert shown["mem_free"] == start.mem_free // 1024
    assert shown["commit_limit"] == start.commit_limit // 1024
    if shown["mem_available"] is not None:
        assert shown["mem_available"] == start.mem_available // 1024
    if m.numa_sysfs:
        assert shown["nodes"] == {
            n.id: (n.mem_free // 1024 * 1024, n.page_cache // 1024 * 1024,
                   n.slab_reclaimable // 1024 * 1024)
            for n in start.nodes
        }  # fmt: skip


# ---- the rules give what the Python formulas they replaced gave ------------------------------


@given(st.integers(0, 1 << 62), st.integers(0, 1024))
def test_round_robin(count: int, n: int) -> None:
    assert _native.interleave(count, n) == [count // n + (i < count % n) for i in range(n)]


@given(st.integers(0, (1 << 62) - 1))
def test_default_watermarks(mem_total: int) -> None:
    min_kb = min(262144, max(128, math.isqrt(mem_total // 1024 * 16)))
    assert _native.default_watermark_low(mem_total) == (min_kb + min_kb // 4) * 1024


@given(st.integers(0, 1 << 40), st.integers(1, 1 << 50), st.integers(0, 1 << 50),
       st.integers(0, 1 << 40))  # fmt: skip
def test_solving_commit_limit_for_the_ratio(limit: int, total: int, pool: int, swap: int) -> None:
    pool = min(pool, total)
    want = None
    if total - pool > 0:
        ratio = Fraction((limit - swap) * 100, total - pool)
        close = ratio >= 0 and abs(ratio - round(ratio)) <= Fraction(1, 20)
        want = round(ratio) if close else None
    assert _native.solve_overcommit_ratio(limit, total, pool, swap) == want


def test_memavailable_and_node_free_from_the_raw_facts() -> None:
    pools = [{"2MiB": 512}, {}, {}]
    m = Machine.x86_64(
        nodes=3, mem_per_node="10GiB", hugepages_per_node=pools, page_cache=3 * GiB,
        slab_reclaimable=GiB, watermark_low=64 * MiB,
    )  # fmt: skip
    m.nodes[2].page_cache = 2 * GiB  # its own figure: the others share the rest by MemTotal
    start = start_numbers(m)
    assert [(n.page_cache, n.slab_reclaimable) for n in start.nodes] == [
        (GiB // 2, GiB // 3), (GiB // 2, GiB // 3), (2 * GiB, GiB - 2 * (GiB // 3))]  # fmt: skip
    assert [n.mem_free for n in start.nodes] == [
        10 * GiB - GiB - GiB // 2 - GiB // 3,
        10 * GiB - GiB // 2 - GiB // 3,
        10 * GiB - 2 * GiB - (GiB - 2 * (GiB // 3)),
    ]
    low, free = 64 * MiB, sum(n.mem_free for n in start.nodes)
    assert start.mem_available == free - low + (3 * GiB - low) + (GiB - low)
    # the host's MemFree given: the nodes without their own share it by MemTotal
    m2 = Machine.x86_64(nodes=2, mem_per_node="8GiB", mem_free=5 * GiB + 1)
    m2.nodes = [Node(0, 8 * GiB, mem_free=GiB), Node(1, 8 * GiB)]
    assert [n.mem_free for n in start_numbers(m2).nodes] == [GiB, 4 * GiB + 1]


@pytest.mark.parametrize(
    ("release", "said", "shown"),
    [("3.13.0", None, False), ("3.14.0", None, True), ("6.8.0", None, True),
     ("3.10.0-1160.el7", True, True), ("5.15.0", False, False)],
)  # fmt: skip
def test_the_memavailable_line_is_the_kernels_rule(
    release: str, said: bool | None, shown: bool
) -> None:
    """Python passes what the host says (a dump, a scenario) or nothing; SimKernel applies the
    3.14 rule (sim_rules.h shows_mem_available)."""
    from umbp_sim.sim import to_sim_config

    m = Machine.x86_64(kernel_version=release, mem_available_line=said)
    assert to_sim_config(m).show_mem_available == (-1 if said is None else int(said))
    assert ("MemAvailable:" in SimHost(m).read("/proc/meminfo")) is shown
