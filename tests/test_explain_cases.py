"""Issue 15's five cases: the why comes from SimKernel's reasons, the fixes from a search that
combines changes, each with the numbers the simulation compared."""

from __future__ import annotations

from pathlib import Path

import pytest

from umbp_sim.diagnose import diagnose
from umbp_sim.diagnose.replay_request import Request
from umbp_sim.diagnose.report import render_text
from umbp_sim.dump import load_dump
from umbp_sim.request import AllocRequest
from umbp_sim.scenario.scenario_run import build_machine
from umbp_sim.scenario.schema import load_scenario

ROOT = Path(__file__).parent.parent
CASES = ROOT / "scenarios" / "explain"
MACHINES = Path(__file__).parent / "data" / "machines"
LLAMA_100 = {"layers": 32, "kv_heads": 8, "head_dim": 128, "dtype": "bfloat16",
             "hicache_size": 100, "page_size": 64}  # fmt: skip
NODE3 = {"SGLANG_HICACHE_HOST_NUMA_NODE": "3"}


def machine_of(name: str):  # type: ignore[no-untyped-def]
    return build_machine(load_scenario(CASES / f"{name}.toml"))


def commands(d) -> list[tuple[list[str], str]]:  # type: ignore[no-untyped-def]
    return [(f.commands, f.outcome_after) for f in d.fixes]


def test_case1_overcommit_surplus_is_the_why_not_enomem() -> None:
    m = machine_of("pool-100-overcommit-1000-request-512")
    d = diagnose(m, None, Request(AllocRequest(1 << 30, "AnonymousHugetlb")))
    assert (d.run.outcome, d.run.observed.actual_backing) == ("ok", "AnonymousHugetlb")
    assert d.causes == [
        "mmap(MAP_HUGETLB) reserves 512 2048 kB pages: 100 available in the pool, and the 412 "
        "missing were allocated as surplus pages (nr_overcommit_hugepages 1000, surplus now 412)"
    ]
    assert not any("ENOMEM" in c for c in d.causes)
    assert d.fixes == [] and "nothing: the request gets what it asks for" in render_text(d)


def test_case2_bound_node_oom_is_explained_with_the_node_numbers() -> None:
    m = machine_of("node0-pool-8g-anonymous-12g-bound-oom")
    d = diagnose(m, None, Request(AllocRequest(12 << 30, "Anonymous", numa_node=0)))
    assert (d.run.outcome, d.run.observed.signal) == ("crashed", "SIGKILL")
    assert d.causes == [
        "out of memory: madvise(MADV_POPULATE_WRITE) needs 12 GiB on node 0, which had 8 GiB "
        "free and 0 GiB of reclaimable page cache and slab; after 8 GiB the kernel's OOM killer "
        "ends the process (SIGKILL)"
    ]
    (reason,) = [r for r in d.run.observed.reasons if r.signal]
    assert (reason.rule, reason.numbers["node_free"], reason.numbers["bytes_needed"]) == (
        "oom",
        8 << 30,
        12 << 30,
    )
    assert commands(d) == [
        (["--numa-node 1"], "ok: Anonymous on node 1"),
        (["--numa-node -1"], "ok: Anonymous"),
    ]


def test_case3_page_cache_is_reclaimed_before_the_oom_killer() -> None:
    m = machine_of("page-cache-reclaimed-before-oom")
    d = diagnose(m, None, Request(AllocRequest(9 << 30, "Anonymous")))
    assert (d.run.outcome, d.exit_code) == ("ok", 0)
    assert d.causes == [] and d.fixes == []
    # Without the page cache the same host kills the process, and the why says why.
    bare = m.copy().apply(page_cache=0, mem_available="6GiB")
    d = diagnose(bare, None, Request(AllocRequest(9 << 30, "Anonymous")))
    assert (d.run.outcome, d.exit_code) == ("crashed", 2)
    assert d.causes[0] == (
        "out of memory: madvise(MADV_POPULATE_WRITE) needs 9 GiB on node 0, which had 6 GiB "
        "free and 0 GiB of reclaimable page cache and slab; after 6 GiB the kernel's OOM killer "
        "ends the process (SIGKILL)"
    )
    assert commands(d) == [(["--size 5529MiB"], "ok: Anonymous")]


@pytest.mark.torch  # start_host_pool makes torch tensors
def test_case4_el7_budget_is_memavailable_from_the_dump() -> None:
    machine, facts = load_dump(MACHINES / "32intel64-2p8co2t+8ve.tar.bz2")
    d = diagnose(machine, facts, Request(sglang=dict(LLAMA_100), env=dict(NODE3)))
    assert d.run.observed.error == (
        "ValueError: Not enough host memory available. Requesting 100.00 GB but only have "
        "74.60 GB free. Please reduce the size of the hierarchical cache."
    )
    assert d.causes[0] == (
        "sglang's host check fails: it needs the 100000595968 bytes (100.00 GB) to be at most "
        "MemAvailable - 10 GiB = 79.48 GiB - 10 GiB = 74.60 GB"
    )
    (best,) = d.fixes
    assert best.commands == [
        "--hicache-size 74", "sysctl -w vm.nr_overcommit_hugepages=31192",
        "SGLANG_HICACHE_HOST_NUMA_NODE=-1",
    ]  # fmt: skip
    assert best.outcome_after == "ok: AnonymousHugetlb"


@pytest.mark.torch  # start_host_pool makes torch tensors
def test_case5_16amd64_needs_a_combination() -> None:
    machine, facts = load_dump(MACHINES / "16amd64-4n4c-cgroup-distance-merge.tar.bz2")
    d = diagnose(machine, facts, Request(sglang=dict(LLAMA_100), env=dict(NODE3)))
    assert d.run.outcome == "failed"
    assert d.causes[0].startswith(
        "sglang's host check fails: it needs the 100000595968 bytes (100.00 GB) to be at most "
        "available - 10 GiB = 27.16 GiB - 10 GiB = 18.42 GB, where available is psutil's "
        "estimate (this kernel's /proc/meminfo has no MemAvailable)"
    )
    # No single change works: the smaller pool alone is OOM-killed on node 3.
    alone = {tuple(f.commands): f.outcome_after for f in d.not_helping}
    assert alone[("--hicache-size 18",)].startswith(
        "crashed: killed by SIGKILL during prefault touch of node 3"
    )
    assert [(f.commands, f.outcome_after) for f in d.fixes][0] == (
        ["--hicache-size 18", "SGLANG_HICACHE_HOST_NUMA_NODE=-1",
         "sysctl -w vm.nr_overcommit_hugepages=6536"],
        "ok: AnonymousHugetlb",
    )  # fmt: skip
    assert d.limit is None


@pytest.mark.torch  # start_host_pool makes torch tensors
@pytest.mark.parametrize("dump", sorted(p.name for p in MACHINES.glob("*.tar.bz2")))
def test_on_call_recipe_on_every_fixture(dump: str) -> None:
    """The README recipe: a fix, or the limit that stands in the way; never a made-up
    MemAvailable (a negative or zero one that the dump does not contain)."""
    machine, facts = load_dump(MACHINES / dump)
    d = diagnose(machine, facts, Request(sglang=dict(LLAMA_100), env=dict(NODE3)))
    text = render_text(d)
    assert d.fixes or (d.limit and f"the limit in the way: {d.limit}" in text)
    for line in text.splitlines():
        if "MemAvailable - 10 GiB = " in line:
            shown = line.split("MemAvailable - 10 GiB = ")[1].split(" GiB")[0]
            assert float(shown) > 0
            assert facts.mem_available is not None


def test_dump_notes_node_totals_and_the_memavailable_estimate() -> None:
    machine, facts = load_dump(MACHINES / "40intel64-2g2n4c+pcilocality.tar.bz2")
    assert (
        "the nodes' MemTotal add up to 536857436 kB, meminfo's MemTotal is 529428392 kB: "
        "per-node memory follows the nodes' files, CommitLimit and the host-wide lines follow "
        "MemTotal"
    ) in facts.notes
    # 3.13-era meminfo without MemAvailable: the kernel's estimate, from the dump's own lines.
    (note,) = [n for n in facts.notes if n.startswith("meminfo has no MemAvailable (a kernel")]
    assert note.startswith(
        "meminfo has no MemAvailable (a kernel before 3.14 without the backport): estimated as "
        "the kernel does (si_mem_available) at 517613838 kB from MemFree 348138760 kB, page "
        "cache 168579748 kB, SReclaimable 1240468 kB and low watermarks 115046 kB"
    )
    assert machine.mem_available == 517613838 * 1024 + machine.mem_available % 1024
    assert machine.mem_available_line is False
    from umbp_sim.sim import SimHost

    assert "MemAvailable" not in SimHost(machine).meminfo()  # the kernel printed none


@pytest.mark.parametrize(
    ("fields", "size", "rule", "want"),
    [
        ({"overcommit_memory": 2}, 12 << 30, "commit_limit",
         [(["sysctl -w vm.overcommit_memory=0"], "ok: Anonymous"),
          (["sysctl -w vm.overcommit_ratio=76"], "ok: Anonymous")]),
        ({"memcg_max": 1 << 30}, 2 << 30, "memcg_oom",
         [(["echo max > /sys/fs/cgroup/<server cgroup>/memory.max"], "ok: Anonymous")]),
        ({"rlimit_as": 1 << 30}, 2 << 30, "rlimit_as",
         [(["ulimit -v unlimited"], "ok: Anonymous")]),
    ],
)  # fmt: skip
def test_limit_fixes_are_searched_and_verified(
    fields: dict, size: int, rule: str, want: list
) -> None:  # type: ignore[type-arg]
    from umbp_sim.machine import Machine

    m = Machine.x86_64(mem_per_node="16GiB").apply(**fields)
    d = diagnose(m, None, Request(AllocRequest(size, "Anonymous")))
    assert any(r.rule == rule for r in d.run.observed.reasons)
    assert d.evidence and d.evidence[0].rules == (rule,)
    assert commands(d) == want


@pytest.mark.torch  # start_host_pool makes torch tensors
def test_a_moot_step_is_dropped_and_the_rest_described_on_what_is_left() -> None:
    """16amd64, node 1, --hicache-size 20. The search finds "release the whole 2 MiB pool (for
    sglang's check), --hicache-size 7 (read from that run's OOM on node 1), grow node 1's pool to
    3340". With --hicache-size 7 sglang's check passes anyway: the release is moot, and the two
    steps alone are simulated and shown. The node step is described on the host they leave (the
    dump's 512 pages free on node 1, not the 0 after a release); the size step, whose numbers
    came from a run with the release, is said by its command."""
    machine, facts = load_dump(MACHINES / "16amd64-4n4c-cgroup-distance-merge.tar.bz2")
    llama_20 = dict(LLAMA_100, hicache_size=20)
    d = diagnose(
        machine,
        facts,
        Request(sglang=llama_20, env={"SGLANG_HICACHE_HOST_NUMA_NODE": "1"}),
    )
    node1 = "/sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages"
    (fix,) = [f for f in d.fixes if any(node1 in c for c in f.commands)]
    assert fix.commands == ["--hicache-size 7", f"echo 3340 > {node1}"]
    assert fix.action == (
        "all of: --hicache-size 7; grow node 1's 2048 kB pool to 3340 pages (3340 needed there, "
        "512 free)"
    )
    assert fix.outcome_after == "ok: AnonymousHugetlb on node 1"
    assert not any("sysctl -w vm.nr_hugepages=0" in f.commands for f in d.fixes)


def test_two_writes_of_one_pool_file_are_not_a_combination() -> None:
    """A combination whose later step writes the file an earlier one wrote keeps only the later
    value: it is not tried (the later step alone is)."""
    from umbp_sim.diagnose.fix import Fix, combine
    from umbp_sim.diagnose.fix_search import host_after, overwrites
    from umbp_sim.diagnose.pool_writes import PoolWrite

    size = 2048 * 1024
    grow = Fix("grow", ["sysctl -w vm.nr_hugepages=100"], "pool",
               host_changes=[PoolWrite("nr_hugepages", size, 100)])  # fmt: skip
    node = Fix("node", ["echo 50 > node0"], "pool",
               host_changes=[PoolWrite("nr_hugepages", size, 50, node=0)])  # fmt: skip
    shrink = Fix("shrink", ["sysctl -w vm.nr_hugepages=0"], "pool",
                 host_changes=[PoolWrite("nr_hugepages", size, 0)])  # fmt: skip
    assert overwrites(combine([grow, shrink]))
    assert not overwrites(combine([shrink, node]))
    # host_after applies the steps in order: the node write after the release is all there is.
    m = machine_of("pool-100-overcommit-1000-request-512")
    host = host_after(m, combine([shrink, node]))
    assert host.hugepages(size).total == host.node_hugepages(0, size).total == 50


def test_node_63_on_mori_names_its_maxnode_rule() -> None:
    # issue 28 point 4: the cause read "mbind rejects these arguments on kernel 3.13.0 (EINVAL)"
    from umbp_sim.machine import Machine

    m = Machine.x86_64(nodes=64, mem_per_node="4GiB", kernel_version="3.13.0")
    d = diagnose(m, None, Request(AllocRequest(1 << 30, "Anonymous", numa_node=63)))
    assert d.run.unbound is not None
    assert d.causes[0] == (
        "mori passes maxnode = 64 (the bits of its 1-word node mask) and the kernel reads "
        "maxnode - 1 = 63 bits, nodes 0-62: node 63 is outside them, so the mask mbind sees is "
        "empty and it fails with EINVAL (mori's maxnode rule, docs/deployed-behaviour.md row 4; "
        "umbp-sim's allocator passes node + 2 and binds)"
    )
    assert not any("rejects these arguments" in c for c in d.causes)
    # node 127: a 2-word mask, maxnode 128
    m = Machine.x86_64(nodes=128, mem_per_node="1GiB")
    d = diagnose(m, None, Request(AllocRequest(1 << 20, "Anonymous", numa_node=127)))
    assert d.causes[0].startswith(
        "mori passes maxnode = 128 (the bits of its 2-word node mask) and the kernel reads "
        "maxnode - 1 = 127 bits, nodes 0-126: node 127 is outside them"
    )
