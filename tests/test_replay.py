"""umbp-sim replay: each numeric field failure replayed from a dump; exact texts, verified fixes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from umbp_sim.cli import main

DATA = Path(__file__).parent / "data"
D = DATA / "replay"
MACHINES = DATA / "machines"
LLAMA = ["--model-layers", "32", "--kv-heads", "8", "--head-dim", "128", "--page-size", "64"]
DEEPSEEK = ["--model-layers", "61", "--kv-lora-rank", "512", "--qk-rope-head-dim", "64",
            "--page-size", "64"]  # fmt: skip
RDMA = "some RDMA NICs cannot register a large region of 4 KiB pages"


def replay(capsys, *argv: str) -> dict:  # type: ignore[no-untyped-def]
    # umbp-sim's allocator: the field's (mori) replays are in test_replay_field.py
    assert main(["replay", *map(str, argv), "--allocator", "umbp-sim", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    for key in ("outcome", "actual_backing", "error", "signal", "warnings", "causes", "fixes"):
        assert key in doc
    for fix in doc["fixes"]:
        assert set(fix) >= {"action", "commands", "outcome_after"}
    return doc


def fix_commands(doc: dict) -> dict[str, str]:
    return {c: f["outcome_after"] for f in doc["fixes"] for c in f["commands"]}


def not_helping(doc: dict) -> dict[str, str]:
    return {c: f["outcome_after"] for f in doc["fixes_not_helping"] for c in f["commands"]}


@pytest.mark.torch  # start_host_pool makes torch tensors
def test_report1_not_enough_host_memory_7_05(capsys) -> None:  # type: ignore[no-untyped-def]
    doc = replay(capsys, D / "report1-7.05GB", *LLAMA, "--hicache-ratio", "2.0",
                 "--device-pool-tokens", "26880")  # fmt: skip
    assert doc["outcome"] == "failed"
    assert doc["error"] == (
        "ValueError: Not enough host memory available. Requesting 7.05 GB but only have 2.04 GB "
        "free. Please reduce the size of the hierarchical cache."
    )
    assert doc["causes"][1] == (
        "MemAvailable excludes the 16 GiB hugetlb pool (8192 x 2048 kB pages, 8192 free): the "
        "check cannot see it"
    )
    # 7,054,819,328 B = 3364 pages stay; the deficit 5,014,765,568 B = 2392 pages go.
    assert fix_commands(doc) == {
        "--hicache-size 2": "ok: AnonymousHugetlb",
        "sysctl -w vm.nr_hugepages=5800": "ok: AnonymousHugetlb",
    }


@pytest.mark.torch  # start_host_pool makes torch tensors
def test_report2_not_enough_host_memory_176_71(capsys) -> None:  # type: ignore[no-untyped-def]
    doc = replay(capsys, D / "report2-176.71GB", *DEEPSEEK, "--hicache-ratio", "2.0",
                 "--device-pool-tokens", "1257280")  # fmt: skip
    assert doc["outcome"] == "failed"
    assert doc["error"] == (
        "ValueError: Not enough host memory available. Requesting 176.71 GB but only have "
        "105.82 GB free. Please reduce the size of the hierarchical cache."
    )
    assert doc["causes"][0] == (
        "sglang's host check fails: it needs the 176707657728 bytes (176.71 GB) to be at most "
        "MemAvailable - 10 GiB = 108.55 GiB - 10 GiB = 105.82 GB"
    )
    assert doc["causes"][1].startswith("MemAvailable excludes the 1582 GiB hugetlb pool")
    assert fix_commands(doc) == {
        "--hicache-size 105": "ok: AnonymousHugetlb",
        "sysctl -w vm.nr_hugepages=776181": "ok: AnonymousHugetlb",
    }


@pytest.mark.torch  # start_host_pool makes torch tensors
def test_100gb_example_page_count_and_pool_fix(capsys) -> None:  # type: ignore[no-untyped-def]
    doc = replay(capsys, D / "no-pool-512g", *LLAMA, "--hicache-size", "100")
    assert doc["outcome"] == "demoted"
    assert doc["actual_backing"] == "Anonymous"
    assert (
        "2048 kB pages needed: 47684; HugePages_Free 0, Rsvd 0: 0 available, 47684 short, and "
        "nr_overcommit_hugepages 0 (surplus 0) allows no more: mmap(MAP_HUGETLB) fails with ENOMEM"
    ) in doc["causes"]
    assert any(RDMA in c for c in doc["causes"])
    assert doc["warnings"][-1].startswith(
        "UMBPHostTensorAllocator: requested UMBPHostBufferBacking.AnonymousHugetlb backing "
        "but kernel demoted"
    )
    assert fix_commands(doc) == {
        "sysctl -w vm.nr_hugepages=47684": "ok: AnonymousHugetlb",
        "sysctl -w vm.nr_overcommit_hugepages=47684": "ok: AnonymousHugetlb",
    }
    # The raw form of the same request.
    raw = replay(capsys, D / "no-pool-512g", "--size", "100000595968", "--backing", "hugetlb")
    assert raw["outcome"] == "demoted"
    assert raw["warnings"] == [
        "hugetlb mmap of 100000595968 bytes (2048 kB pages) failed: ENOMEM; HugePages of 2048 "
        "kB: free 0, total 0, reserved 0; falling back to 4 KiB pages (Anonymous)"
    ]
    assert fix_commands(raw) == fix_commands(doc)


@pytest.mark.parametrize(
    ("dump", "outcome", "signal"),
    [("dpdk-socket0-5.15.0", "demoted", None), ("dpdk-socket0-4.18.0", "crashed", "SIGBUS")],
)
def test_dpdk_socket0_shape(capsys, dump: str, outcome: str, signal: str | None) -> None:  # type: ignore[no-untyped-def]
    doc = replay(capsys, D / dump, "--size", "4096MiB", "--numa-node", "0")
    assert doc["outcome"] == outcome
    assert doc["signal"] == signal
    why = (
        "the reservation is global (8984 pages available on the host), so mmap succeeds; the "
        "pages are taken from node 0 at fault time and it has 16 of the 2048 needed (2048 kB "
        "pages; nr_overcommit_hugepages 0, surplus 0): "
    )
    if signal:
        assert doc["error"].startswith(
            "killed by SIGBUS during prefault touch of node 0 (2048 kB pages)"
        )
        # the cause the crash came from first, then what only sent mori to touch by hand
        assert doc["causes"][:2] == [
            why + "prefault touch faults on a missing page and the process is killed by SIGBUS",
            "kernel 4.18.0-513.el8.x86_64 is older than 5.14, which added "
            "MADV_POPULATE_READ/WRITE: EINVAL",
        ]
        assert doc["cause_sources"][:2] == ["kernel", "kernel"]
    else:
        assert doc["warnings"][0].startswith(
            "MADV_POPULATE_WRITE of 4294967296 bytes (2048 kB pages) failed: EFAULT"
        )
        assert doc["causes"][0] == why + "madvise(MADV_POPULATE_WRITE) returns EFAULT"
    assert fix_commands(doc) == {
        "echo 2064 > /sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages":
            "ok: AnonymousHugetlb on node 0",
        "--numa-node 1": "ok: AnonymousHugetlb on node 1",
        "--numa-node -1": "ok: AnonymousHugetlb",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("dump", "outcome"), [("pool-on-node0-6.8.0", "demoted"), ("pool-on-node0-5.10.0", "crashed")]
)
def test_per_node_exhaustion(capsys, dump: str, outcome: str) -> None:  # type: ignore[no-untyped-def]
    doc = replay(capsys, D / dump, "--size", "1GiB", "--numa-node", "1")
    assert doc["outcome"] == outcome
    assert any(
        c.startswith(
            "the reservation is global (1024 pages available on the host), so mmap succeeds; the "
            "pages are taken from node 1 at fault time and it has 0 of the 512 needed"
        )
        for c in doc["causes"]
    )
    if outcome == "crashed":
        assert doc["signal"] == "SIGBUS"
        assert doc["error"].startswith("killed by SIGBUS during prefault touch of node 1")
    else:
        assert any("madvise(MADV_POPULATE_WRITE) returns EFAULT" in c for c in doc["causes"])
        assert any(RDMA in c for c in doc["causes"])
    assert fix_commands(doc) == {
        "echo 512 > /sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages":
            "ok: AnonymousHugetlb on node 1",
        "--numa-node 0": "ok: AnonymousHugetlb on node 0",
        "--numa-node -1": "ok: AnonymousHugetlb",
    }  # fmt: skip


def test_wrong_node_raw(capsys) -> None:  # type: ignore[no-untyped-def]
    doc = replay(capsys, D / "pool-on-node0-6.8.0", "--size", "1GiB", "--numa-node", "3")
    assert doc["outcome"] == "ok" and doc["got_what_was_asked"] is False
    assert doc["warnings"] == [
        "numa_node 3 is not a possible NUMA node (possible: 0-1); buffer not bound"
    ]
    assert doc["causes"][0].startswith("node 3 does not exist: possible nodes are 0-1")
    assert fix_commands(doc) == {
        "--numa-node 0": "ok: AnonymousHugetlb on node 0",
        "--numa-node -1": "ok: AnonymousHugetlb",
    }
    assert not_helping(doc) == {"--numa-node 1": "demoted: Anonymous (4 KiB pages)"}


@pytest.mark.torch  # start_host_pool makes torch tensors
def test_wrong_node_sglang_needs_two_changes(capsys) -> None:  # type: ignore[no-untyped-def]
    doc = replay(capsys, D / "no-pool-512g", *LLAMA, "--hicache-size", "4",
                 "--env", "SGLANG_HICACHE_HOST_NUMA_NODE=3")  # fmt: skip
    assert doc["outcome"] == "demoted"
    assert doc["causes"][1].startswith("node 3 does not exist: possible nodes are 0-1")
    cmds = fix_commands(doc)
    # Binding alone or the pool alone is not enough; both together are verified.
    assert ["sysctl -w vm.nr_hugepages=1908"] not in [f["commands"] for f in doc["fixes"]]
    assert cmds["SGLANG_HICACHE_HOST_NUMA_NODE=0"] == "ok: AnonymousHugetlb on node 0"
    # Unbinding alone changes nothing (demoted as before): a compromise that changes nothing is
    # not listed as "does not help".
    assert "SGLANG_HICACHE_HOST_NUMA_NODE=-1" not in not_helping(doc)
    combined = [f for f in doc["fixes"] if f["action"].startswith("all of:")]
    assert combined[0]["commands"] == [
        "sysctl -w vm.nr_hugepages=1908",
        "SGLANG_HICACHE_HOST_NUMA_NODE=-1",
    ]
    assert combined[0]["outcome_after"] == "ok: AnonymousHugetlb"


def test_nr_hugepages_zero(capsys) -> None:  # type: ignore[no-untyped-def]
    doc = replay(capsys, D / "no-pool-512g", "--size", "1GiB")
    assert doc["outcome"] == "demoted"
    assert fix_commands(doc) == {
        "sysctl -w vm.nr_hugepages=512": "ok: AnonymousHugetlb",
        "sysctl -w vm.nr_overcommit_hugepages=512": "ok: AnonymousHugetlb",
    }


@pytest.mark.torch  # start_host_pool makes torch tensors
def test_one_gib_pages_empty_pool(capsys) -> None:  # type: ignore[no-untyped-def]
    doc = replay(capsys, D / "empty-1g-pool", "--size", "4GiB", "--hugepage-size", "1GiB")
    assert doc["outcome"] == "demoted"
    assert doc["causes"][0].startswith(
        "1048576 kB pages needed: 4; HugePages_Free 0, Rsvd 0: 0 available, 4 short"
    )
    # Gigantic pages cannot be surplus before 6.19: the write is refused, and shown so.
    assert not_helping(doc) == {
        "echo 4 > /sys/kernel/mm/hugepages/hugepages-1048576kB/nr_overcommit_hugepages":
            "demoted: Anonymous (4 KiB pages) (the kernel refused nr_overcommit_hugepages=4: "
            "Invalid argument)"
    }  # fmt: skip
    assert fix_commands(doc) == {
        "echo 4 > /sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages":
            "ok: AnonymousHugetlb",
        "--hugepage-size 2MiB": "ok: AnonymousHugetlb",
    }  # fmt: skip
    sg = replay(capsys, D / "empty-1g-pool", *LLAMA, "--hicache-size", "4",
                "--env", "SGLANG_HICACHE_HOST_HUGEPAGE_SIZE=1073741824")  # fmt: skip
    assert sg["outcome"] == "demoted"
    assert "SGLANG_HICACHE_HOST_HUGEPAGE_SIZE=2097152" in fix_commands(sg)


@pytest.mark.torch  # start_host_pool makes torch tensors
def test_malformed_env_value_is_fixed(capsys) -> None:  # type: ignore[no-untyped-def]
    doc = replay(capsys, D / "empty-1g-pool", *LLAMA, "--hicache-size", "4",
                 "--env", "SGLANG_HICACHE_HOST_HUGEPAGE_SIZE=2M")  # fmt: skip
    assert doc["outcome"] == "failed"
    assert doc["error"] == "ValueError: invalid literal for int() with base 10: '2M'"
    assert fix_commands(doc) == {
        "export SGLANG_HICACHE_HOST_HUGEPAGE_SIZE=2097152": "ok: AnonymousHugetlb"
    }


# ---- real fixture dumps ----------------------------------------------------------------------


def test_fixture_32intel64_fits_and_does_not(capsys) -> None:  # type: ignore[no-untyped-def]
    dump = MACHINES / "32intel64-2p8co2t+8ve.tar.bz2"
    ok = replay(capsys, dump, "--size", "4GiB")
    assert ok["outcome"] == "ok" and ok["fixes"] == []
    assert ok["warnings"] == [
        "madvise(MADV_POPULATE_WRITE) is not supported by this kernel (EINVAL; needs Linux "
        "5.14); prefaulting by touching one byte per page"
    ]
    big = replay(capsys, dump, "--size", "10GiB")
    assert big["outcome"] == "demoted"
    assert big["causes"][0].startswith(
        "2048 kB pages needed: 5120; HugePages_Free 4096, Rsvd 0: 4096 available, 1024 short"
    )
    assert fix_commands(big) == {
        "sysctl -w vm.nr_hugepages=5120": "ok: AnonymousHugetlb",
        "sysctl -w vm.nr_overcommit_hugepages=1024": "ok: AnonymousHugetlb",
    }
    bound = replay(capsys, dump, "--size", "6GiB", "--numa-node", "1")
    assert bound["outcome"] == "crashed" and bound["signal"] == "SIGBUS"
    assert fix_commands(bound) == {
        "echo 3072 > /sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages":
            "ok: AnonymousHugetlb on node 1",
        "--numa-node -1": "ok: AnonymousHugetlb",
    }  # fmt: skip


def test_fixture_40intel64_no_pool(capsys) -> None:  # type: ignore[no-untyped-def]
    doc = replay(capsys, MACHINES / "40intel64-2g2n4c+pcilocality.tar.bz2", "--size", "8GiB",
                 "--numa-node", "2")  # fmt: skip
    assert doc["outcome"] == "demoted"
    assert doc["causes"][0].startswith(
        "2048 kB pages needed: 4096; HugePages_Free 0, Rsvd 0: 0 available, 4096 short"
    )
    assert fix_commands(doc) == {
        "echo 4096 > /sys/devices/system/node/node2/hugepages/hugepages-2048kB/nr_hugepages":
            "ok: AnonymousHugetlb on node 2"
    }  # fmt: skip
    # The global sysctl interleaves 1024 pages per node over 4 nodes: node 2 still runs short.
    assert not_helping(doc)["sysctl -w vm.nr_hugepages=4096"].startswith(
        "crashed: killed by SIGBUS"
    )


def test_fixture_i386_without_hugetlb(capsys) -> None:  # type: ignore[no-untyped-def]
    doc = replay(capsys, MACHINES / "2i386-2c-nohugepage.tar.bz2", "--size", "64MiB")
    assert doc["outcome"] == "demoted"
    assert doc["causes"][0].startswith("this kernel has no 2048 kB hugepages (sizes: none)")
    assert fix_commands(doc) == {"--backing anonymous": "ok: Anonymous"}


def test_text_output_sections(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["replay", str(D / "pool-on-node0-5.10.0"), "--size", "1GiB",
                 "--numa-node", "1"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "1. what the user saw\n   outcome: crashed" in out
    assert "\n2. why\n" in out and "\n3. what to change\n" in out
    assert "      simulated: ok: AnonymousHugetlb on node 1" in out


def test_fixture_32intel64_100gb_does_not_fit_in_ram(capsys) -> None:  # type: ignore[no-untyped-def]
    # The failure umbp-sim was built to explain (alloc(100000595968 bytes) failed, numa_node=3)
    # on a 93 GiB host: the hugetlb mmap fails (4096 of 47684 pages), the buffer demotes to
    # 4 KiB pages, and prefaulting 93 GiB of ordinary memory on a host with 33.57 GiB free ends
    # in the OOM killer. The only fix that works asks for less.
    dump = MACHINES / "32intel64-2p8co2t+8ve.tar.bz2"
    doc = replay(capsys, dump, "--size", "100000595968", "--numa-node", "3")
    assert (doc["outcome"], doc["signal"]) == ("crashed", "SIGKILL")
    assert (
        "out of memory: prefault touch needs 93.13 GiB on the 2 nodes it may use, which had "
        "33.55 GiB free and 46.45 GiB of reclaimable page cache and slab; after 80.00 GiB the "
        "kernel's OOM killer ends the process (SIGKILL)"
    ) in doc["causes"]
    fixes = [(f["commands"], f["outcome_after"]) for f in doc["fixes"]]
    assert fixes == [
        (["--size 8GiB", "--numa-node -1"], "ok: AnonymousHugetlb"),
    ]
    assert not_helping(doc)["sysctl -w vm.nr_hugepages=47684"].startswith(
        "crashed: killed by SIGKILL"
    )


@pytest.mark.torch  # start_host_pool makes torch tensors
def test_an_sglang_replay_builds_a_kernel_per_simulation_only(capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The questions about the dumped host (explain's host check, the fix candidates) are asked
    of the state the baseline's run kept; every kernel is one simulation run (the request, then
    each fix tried, each switch to another hugepage size extended by its pool). A kernel per
    question gave 13 for this replay (before the size switches were extended), a shared one
    12."""
    import umbp_sim.engine.execute as execute
    from umbp_sim import _native, sim

    built: list[int] = []
    runs: list[int] = []

    class CountingKernel(_native.SimKernel):  # type: ignore[misc]
        def __init__(self, config: object) -> None:
            built.append(1)
            super().__init__(config)

    fresh_host = execute.fresh_host

    def counting_fresh_host(machine):  # type: ignore[no-untyped-def]
        runs.append(1)
        return fresh_host(machine)

    monkeypatch.setattr(_native, "SimKernel", CountingKernel)
    monkeypatch.setattr(execute, "fresh_host", counting_fresh_host)
    monkeypatch.setattr(sim, "_VIEWS", {})
    replay(capsys, D / "no-pool-512g", *LLAMA, "--hicache-size", "100")
    assert len(runs) == 14 and len(built) == len(runs)


def test_a_demoted_buffer_is_said_on_the_hosts_base_pages(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A ppc64le host has 64 KiB base pages: the demotion, the fix that gives up hugepages and
    the "saw" line say so (they said "4 KiB" on every host)."""
    from umbp_sim.diagnose.fixes import candidates
    from umbp_sim.diagnose.replay_request import Request
    from umbp_sim.diagnose.simulate import simulate_request
    from umbp_sim.machine import Machine
    from umbp_sim.request import AllocRequest
    from umbp_sim.sim import SimHost

    power = Machine.ppc64le(
        mem_per_node="64GiB", hugepages={"2MiB": 16}, kernel_version="5.14.0-70.el9.ppc64le"
    )
    SimHost(power).render(tmp_path / "p")
    doc = replay(capsys, tmp_path / "p", "--size", "1GiB", "--backing", "hugetlb")
    assert doc["outcome"] == "demoted"
    # 1 GiB pages (no pool of them either) change nothing: not listed as "does not help".
    assert "--hugepage-size 1GiB" not in not_helping(doc)
    request = Request(AllocRequest(1 << 30, "AnonymousHugetlb"))
    actions = [f.action for f in candidates(power, request, simulate_request(power, request))]
    assert "do not ask for hugepages: plain 64 KiB pages" in actions
    assert main(["replay", str(tmp_path / "p"), "--size", "1GiB", "--backing", "hugetlb",
                 "--allocator", "umbp-sim"]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "demoted: hugepages were asked for, the buffer is on 64 KiB pages" in text
    assert not re.search(r"(?<!\d)4 KiB", text)
