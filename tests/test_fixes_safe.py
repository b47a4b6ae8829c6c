"""Fixes safe to apply on the host as deployed: for an sglang error line, each fix passes
sglang's own host check once applied (checked here on a fresh host the fix leaves, by reading
its meminfo as sglang does, apart from the fix search), carries no step it does without, is
written in sglang's knobs; a node the request cannot be bound to is named in "why"."""

from __future__ import annotations

import json

import pytest

from umbp_sim import Machine
from umbp_sim.cli import main
from umbp_sim.diagnose import diagnose
from umbp_sim.diagnose.error_line import parse_error_line
from umbp_sim.diagnose.fix import Fix, combine, knob_of
from umbp_sim.diagnose.fix_search import run_fix
from umbp_sim.diagnose.replay_request import Request
from umbp_sim.engine.host_changes import apply_change
from umbp_sim.request import AllocRequest
from umbp_sim.sglang.sizing import host_memory_budget, parse_meminfo
from umbp_sim.sim import SimHost

LINE = (
    "RuntimeError: UMBPHostMemAllocator.alloc({size} bytes) failed "
    "(requested_backing=UMBPHostBufferBacking.AnonymousHugetlb, numa_node={node})."
)
# The plain hosts of the issue: one node of 24 GiB, two of 16 GiB, four of 128 GiB with a
# small pool.
HOSTS = {
    "one24": lambda: Machine.x86_64(nodes=1, mem_per_node="24GiB"),
    "two16": lambda: Machine.x86_64(nodes=2, mem_per_node="16GiB"),
    "four128": lambda: Machine.x86_64(
        nodes=4, mem_per_node="128GiB", hugepages_per_node=[{"2MiB": 512}] * 4
    ),
}
LINES = [(100000595968, 1), (100000595968, -1), (20006830080, 0)]
RAW_FLAGS = ("--size", "--backing", "--numa-node", "--hugepage-size")


def line_request(size: int, node: int) -> Request:
    line = parse_error_line(LINE.format(size=size, node=node), "--error")
    alloc = AllocRequest(line.size, line.backing, 2 << 20, line.numa_node, True)
    return Request(alloc, error_line=line)


def budget_after(machine: Machine, fix: Fix) -> int:
    """sglang's budget (MemAvailable - 10 GiB) on a fresh host the fix leaves."""
    host = SimHost(fix.machine(machine).copy())
    for change in fix.host_changes:
        apply_change(host, change)
    return host_memory_budget(parse_meminfo(host.read("/proc/meminfo")))


@pytest.mark.parametrize("host", sorted(HOSTS))
@pytest.mark.parametrize(("size", "node"), LINES)
def test_every_fix_for_an_error_line_passes_sglangs_check_once_applied(
    host: str, size: int, node: int
) -> None:
    machine = HOSTS[host]()
    request = line_request(size, node)
    d = diagnose(machine, None, request)
    assert d.fixes, d.limit
    for fix in d.fixes:
        asked = fix.request(request).raw.size
        assert asked <= budget_after(machine, fix), (fix.commands, asked)
        assert fix.run is not None and fix.run.outcome in ("ok", "demoted")
    # Safe: fix 1 leaves the rest of the server what sglang keeps for it, on every node; an
    # unsafe fix says so and never comes before a safe one.
    assert d.fixes[0].safety is None, d.fixes[0].commands
    flags = [f.safety is not None for f in d.fixes]
    assert flags == sorted(flags)
    for fix in d.fixes:
        # sglang's knobs only: the server is configured with them, not umbp-sim's flags
        assert not any(c.startswith(RAW_FLAGS) for c in fix.commands), fix.commands


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_no_fix_carries_a_step_it_does_without(host: str) -> None:
    """Minimal: each step of each fix, removed and re-simulated, does worse."""
    machine = HOSTS[host]()
    request = line_request(100000595968, 1)
    d = diagnose(machine, None, request)
    for fix in d.fixes:
        assert fix.run is not None
        for i in range(len(fix.singles)):
            if len(fix.singles) == 1:
                break
            rest = combine(fix.singles[:i] + fix.singles[i + 1 :])
            run = run_fix(machine, request, rest)
            assert run.rank < fix.run.rank, (fix.commands, fix.singles[i].commands)
    assert not any("vm.overcommit_memory=1" in c for f in d.fixes for c in f.commands)


def test_a_node_without_memory_is_named_even_when_the_pool_fails_first() -> None:
    machine = HOSTS["one24"]()
    d = diagnose(machine, None, line_request(100000595968, 1))
    assert d.run.outcome == "failed"  # the pool (mmap) fails before any binding is tried
    assert d.causes[0] == (
        "node 1 does not exist: the host's nodes are 0: no buffer can be bound there, "
        "whatever else changes"
    )
    assert [c.source for c in d.evidence][0] == "host"
    # every fix moves the binding, since none can get the buffer onto node 1
    assert all(
        any(c.startswith("SGLANG_HICACHE_HOST_NUMA_NODE=") for c in f.commands) for f in d.fixes
    )


def test_a_node_with_no_memory_is_named() -> None:
    machine = Machine.x86_64(nodes=2, mem_per_node="32GiB")
    machine.nodes[1].mem_total = 0  # a CPU-only node
    d = diagnose(machine, None, Request(AllocRequest(1 << 30, "Anonymous", numa_node=1)))
    assert (
        "node 1 has no memory (a CPU-only or device node): no buffer can be bound there, "
        "whatever else changes"
    ) in d.causes


def test_an_unsafe_fix_for_a_raw_request_says_so_and_comes_after_the_safe_ones() -> None:
    """A raw request (no sglang check): a fix that leaves the host under 10 GiB of MemAvailable
    is marked with the figure and never put before a safe one."""
    machine = HOSTS["one24"]()
    request = Request(AllocRequest(30 << 30, "Anonymous"))
    d = diagnose(machine, None, request)
    assert d.run.outcome == "failed"  # overcommit_memory 0: larger than RAM + swap
    assert d.fixes
    assert d.fixes[0].safety is None
    flags = [f.safety is not None for f in d.fixes]
    assert flags == sorted(flags)
    unsafe = Fix(
        "x", ["--size 22GiB"], "buffer", request_change=lambda r: r.with_alloc(size=22 << 30)
    )
    run_fix(machine, request, unsafe)
    assert unsafe.safety is not None
    assert unsafe.safety.startswith("unsafe: leaves ")
    assert unsafe.safety.endswith(
        " GiB of MemAvailable, under the 10 GiB sglang keeps for the rest of the server"
    )


def test_the_json_carries_each_steps_knob_host_wide_and_safety(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    SimHost(HOSTS["one24"]()).render(tmp_path / "dump")
    rc = main(["replay", str(tmp_path / "dump"), "--error", LINE.format(size=100000595968, node=1),
               "--json"])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    fixes = out["fixes"]
    assert fixes
    for f in fixes:
        assert f["safety"] is None
        assert [s["command"] for s in f["steps"]] == f["commands"]
        for s in f["steps"]:
            assert s["knob"] == knob_of(s["command"])
            assert s["host_wide"] == s["command"].startswith("sysctl ")
    knobs = {s["knob"] for f in fixes for s in f["steps"]}
    assert "--hicache-size" in knobs and "SGLANG_HICACHE_HOST_NUMA_NODE" in knobs


@pytest.mark.parametrize(
    ("command", "knob"),
    [
        ("sysctl -w vm.nr_hugepages=3370", "vm.nr_hugepages"),
        ("echo 5 > /sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages",
         "/sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages"),
        ("SGLANG_HICACHE_HOST_NUMA_NODE=0", "SGLANG_HICACHE_HOST_NUMA_NODE"),
        ("export SGLANG_HICACHE_HOST_HUGEPAGE_SIZE=2097152", "SGLANG_HICACHE_HOST_HUGEPAGE_SIZE"),
        ("--hicache-size 7", "--hicache-size"),
        ("ulimit -v unlimited", "ulimit"),
    ],
)  # fmt: skip
def test_knob_of_names_what_a_step_changes(command: str, knob: str) -> None:
    assert knob_of(command) == knob


def test_ranks_share_one_pool_and_every_fix_holds_for_all_of_them(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """8 ranks of 174 GB on one host whose pool holds four of them (the MI355X report's shape):
    ranks 4-7 are named as the ones that do not get hugepages, and every fix offered holds for
    all eight, each rank's sglang check included."""
    machine = Machine.x86_64(nodes=2, mem_per_node="1536GiB", hugepages={"2MiB": 409600})
    SimHost(machine).render(tmp_path / "dump")
    line = LINE.format(size=174000000000, node=-1)
    rc = main(["replay", str(tmp_path / "dump"), "--error", line, "--ranks", "8", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["ranks"] == 8
    assert [r["outcome"] for r in out["rank_outcomes"]] == ["ok"] * 4 + ["demoted"] * 4
    assert out["fixes"]
    for f in out["fixes"]:
        assert [r["outcome"] for r in f["rank_outcomes"]] == ["ok"] * 8, f["commands"]
    # the pool fix is sized for the four ranks it was short for, not for one
    (grow,) = [f for f in out["fixes"] if f["commands"][0].startswith("sysctl -w vm.nr_hugepages=")]
    assert grow["commands"] == [f"sysctl -w vm.nr_hugepages={409600 + 4 * 82970 - 77720}"]


def test_one_rank_fix_is_not_offered_for_eight(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """A one-rank fix (pool for one buffer) does not hold for eight: with --ranks 8 none offered
    leaves a rank failing or demoted."""
    machine = Machine.x86_64(nodes=1, mem_per_node="24GiB")
    request = Request(AllocRequest(1 << 30, "AnonymousHugetlb"), ranks=8)
    d = diagnose(machine, None, request)
    assert [r["outcome"] for r in d.run.observed.ranks] == ["demoted"] * 8
    assert d.fixes
    for f in d.fixes:
        assert f.run is not None
        assert [r["outcome"] for r in f.run.observed.ranks] == ["ok"] * 8, f.commands


@pytest.mark.parametrize("value", ["0", "65", "x"])
def test_ranks_out_of_range_is_a_usage_error(value: str, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as e:
        main(["replay", "--size", "1GiB", "--ranks", value])
    assert e.value.code == 64
    assert "--ranks" in capsys.readouterr().err


def test_tp_size_is_the_default_ranks() -> None:
    import argparse

    from umbp_sim.diagnose.replay_request import request_from_args
    from umbp_sim.diagnose.request_flags import add_request_arguments

    parser = argparse.ArgumentParser()
    add_request_arguments(parser)
    flags = ["--model-layers", "32", "--kv-heads", "8", "--head-dim", "128", "--hicache-size", "10"]
    assert request_from_args(parser.parse_args([*flags, "--tp-size", "8"])).ranks == 8
    assert (
        request_from_args(parser.parse_args([*flags, "--tp-size", "8", "--ranks", "4"])).ranks == 4
    )
    assert request_from_args(parser.parse_args(flags)).ranks == 1


def test_preflight_writes_the_page_replay_does(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    SimHost(HOSTS["one24"]()).render(tmp_path / "dump")
    page = tmp_path / "preflight.html"
    argv = ["preflight", "--root", str(tmp_path / "dump"), "--error",
            LINE.format(size=100000595968, node=1), "--html", str(page)]  # fmt: skip
    assert main(argv) == 2
    text = capsys.readouterr().out
    html = page.read_text()
    assert "preflight of alloc(100000595968 bytes" in html
    assert "preflight of alloc(100000595968 bytes" in text
    assert "node 1 does not exist: the host&#x27;s nodes are 0" in html
    assert "host-wide, every workload on the host lives with: sysctl -w vm.nr_hugepages=" in html


def test_preflight_html_is_refused_with_verify(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    rc = main(["preflight", "--size", "1GiB", "--verify", "--html", str(tmp_path / "p.html")])
    assert rc == 64
    assert capsys.readouterr().err == (
        "umbp-sim preflight: --verify cannot be combined with --html: the page shows a prediction\n"
    )
    assert not (tmp_path / "p.html").exists()


def test_every_blocker_is_named_not_only_the_first() -> None:
    """An empty pool is met first; once it is grown, the hugetlb cgroup limit would kill the
    prefault: "why" names both (the second from the run of the pool fix)."""
    machine = Machine.x86_64(nodes=1, mem_per_node="64GiB", hugetlb_cgroup_max={"2MiB": 1 << 30})
    d = diagnose(machine, None, Request(AllocRequest(4 << 30, "AnonymousHugetlb")))
    assert d.run.outcome == "demoted"
    assert [c.text for c in d.behind] == [
        "behind it, once sysctl -w vm.nr_hugepages=2048: the hugetlb cgroup limit for 2048 kB "
        "pages is 1073741824 bytes (512 pages), 2048 needed: enforced at fault time, and the "
        "process is killed by SIGBUS"
    ]
    assert d.to_json()["blockers_behind"] == [c.text for c in d.behind]


def test_moris_dram_tier_is_one_more_allocation_in_each_rank() -> None:
    """UMBP_DRAM_* asks for mori's DRAM tier: each rank allocates it after its pool, on the
    same host; a tier that cannot be allocated stops the rank with mori's words."""
    machine = Machine.x86_64(nodes=1, mem_per_node="24GiB", overcommit_memory=2,
                             overcommit_ratio=50)  # fmt: skip
    env = {"UMBP_DRAM_CAPACITY": str(8 << 30)}
    request = Request(AllocRequest(8 << 30, "Anonymous"), env=env, ranks=2)
    d = diagnose(machine, None, request)
    ranks = d.run.observed.ranks
    assert [(r["outcome"], r.get("dram_tier")) for r in ranks] == [
        ("failed", "failed"),
        ("failed", None),
    ]
    assert ranks[0]["error"] == f"DRAMTier: memory allocation failed for {8 << 30} bytes"
    assert d.run.observed.error == ranks[0]["error"]
    assert request.describe().endswith(
        f", then mori's DRAM tier alloc({8 << 30} bytes, backing Anonymous, hugepage_size "
        "2MiB, numa_node -1, prefault on)"
    )
    # without the tier the same ranks get their pools: the tier is what fails them
    alone = diagnose(machine, None, Request(AllocRequest(4 << 30, "Anonymous"), ranks=2))
    assert alone.run.outcome == "ok"


@pytest.mark.parametrize(
    ("pair", "error"),
    [
        ("UMBP_DRAM_CAPACITY=4G", "--env UMBP_DRAM_CAPACITY='4G': expected an integer"),
        ("UMBP_DRAM_NUMA_NODE=-2", "--env UMBP_DRAM_NUMA_NODE=-2: expected -1 to 2147483647"),
    ],
)
def test_a_dram_tier_value_mori_cannot_read_is_a_usage_error(pair: str, error: str, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["preflight", "--size", "1GiB", "--env", pair]) == 64
    assert capsys.readouterr().err == f"umbp-sim preflight: {error}\n"


@pytest.mark.torch  # start_host_pool makes torch tensors
def test_tp8_on_one_host_is_sized_for_eight_ranks() -> None:
    """preflight --tp-size 8 of 10 GB per rank on a 24 GiB host: seven ranks fail sglang's
    check; the fix sizes --hicache-size for eight pools, and holds for all eight."""
    machine = HOSTS["one24"]()
    table = {"layers": 32, "kv_heads": 8, "head_dim": 128, "hicache_size": 10,
             "page_size": 64, "tp_size": 8}  # fmt: skip
    d = diagnose(machine, None, Request(sglang=table, ranks=8))
    outcomes = [r["outcome"] for r in d.run.observed.ranks]
    assert outcomes[1:] == ["failed"] * 7
    assert all(r["error"].startswith("ValueError: Not enough host memory available.")
               for r in d.run.observed.ranks[1:])  # fmt: skip
    assert d.fixes
    assert d.fixes[0].commands[0] == "--hicache-size 1"
    for f in d.fixes:
        assert f.run is not None
        assert [r["outcome"] for r in f.run.observed.ranks] == ["ok"] * 8, f.commands


def test_an_unsafe_fix_is_never_numbered_as_one_to_apply() -> None:
    """Only unsafe fixes (the DRAM tier and the pool fill a 24 GiB host): no numbered fix;
    the report says there is no safe change and lists them as not recommended."""
    from umbp_sim.diagnose.report import render_text

    machine = HOSTS["one24"]()
    env = {"UMBP_DRAM_CAPACITY": str(8 << 30), "UMBP_DRAM_USE_HUGEPAGES": "1"}
    d = diagnose(machine, None, Request(AllocRequest(8 << 30, "Anonymous"), env=env))
    assert d.fixes and all(f.safety for f in d.fixes)
    text = render_text(d)
    what = text[text.index("3. what to change") :]
    assert "\n   1. " not in what
    assert what.splitlines()[1] == (
        "   no safe change: each change that helps in simulation leaves the rest of the server "
        "less than sglang keeps for it (below, not recommended)"
    )
    assert "\n   unsafe, not recommended (the figure says why):\n   - grow the 2048 kB pool" in what


def test_preflight_refuses_a_bad_page_before_reading_the_host(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "dir").mkdir()
    rc = main(["preflight", "--root", str(tmp_path / "no-such-dump"), "--size", "1GiB",
               "--html", str(tmp_path / "dir")])  # fmt: skip
    assert rc == 73
    assert capsys.readouterr().err == (
        f"umbp-sim preflight: --html {tmp_path / 'dir'}: a directory, not a regular file: refused\n"
    )


def test_a_tp_size_beyond_one_host_needs_ranks(capsys) -> None:  # type: ignore[no-untyped-def]
    argv = ["preflight", "--model-layers", "2", "--kv-heads", "2", "--head-dim", "64",
            "--hicache-size", "1", "--tp-size", "2147483647"]  # fmt: skip
    assert main(argv) == 64
    assert capsys.readouterr().err == (
        "umbp-sim preflight: --tp-size 2147483647: more ranks than one host runs (at most 64); "
        "give --ranks N for the ranks on this host\n"
    )
