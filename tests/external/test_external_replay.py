"""``replay`` and ``preflight`` with ``--allocator PATH``: the dumped host's SimKernel under an
external build (the test allocator), in one server process, its outcome explained from
SimKernel's reasons and its fixes re-run on the same build."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from umbp_sim.cli import main

D = Path(__file__).resolve().parent.parent / "data" / "replay"
PER_NODE = [str(D / "pool-on-node0-6.8.0"), "--size", "1GiB", "--numa-node", "1"]
TINY_POPULATE_WARNING = "populate failed (Bad address); touching pages"


def _json(capsys: pytest.CaptureFixture[str], argv: list[str], code: int) -> dict:
    assert main(argv) == code
    return json.loads(capsys.readouterr().out)


def test_replay_crashes_with_the_planted_sigbus_and_fixes_are_rerun_on_the_build(
    capsys: pytest.CaptureFixture[str], tiny_builds: dict[str, str]
) -> None:
    tiny = tiny_builds["wrap"]
    doc = _json(capsys, ["replay", *PER_NODE, "--allocator", tiny, "--json"], 0)
    assert doc["allocator"] == tiny
    # The test allocator touches by hand after POPULATE_WRITE's EFAULT: the SIGBUS of an empty
    # node, in its alloc call, with the node SimKernel names.
    assert (doc["outcome"], doc["signal"], doc["crash_node"]) == ("crashed", "SIGBUS", 1)
    assert doc["error"].startswith(
        "killed by SIGBUS during prefault touch of node 1 (2048 kB pages): no free 2048 kB hugepage"
    )
    assert doc["warnings"] == [TINY_POPULATE_WARNING] == doc["log"]
    # Explained from SimKernel's reasons, which the interposer printed before the process died.
    assert {r["signal"] for r in doc["reasons"]} >= {"SIGBUS"}
    assert any("killed by SIGBUS" in c for c in doc["causes"])
    # Each fix shown was run on the test allocator.
    assert doc["fixes"] and all(f["outcome"] == "ok" for f in doc["fixes"])
    assert doc["with_umbp_sim_fixes"]["outcome"] == "demoted"
    # Its faults arrive one hugepage at a time, yet the why and the fixes are those of the
    # built-in mori profile, whose prefault touches the buffer in one call: the shortage is the
    # buffer's 512 pages (was "0 of the 1 needed", and a fix growing node 1's pool to 1 page).
    mori = _json(capsys, ["replay", *PER_NODE, "--allocator", "mori-624002c", "--json"], 0)
    assert doc["causes"] == mori["causes"]
    assert doc["error"] == mori["error"]  # the same words for the same death
    assert "it has 0 of the 512 needed" in doc["causes"][0]
    assert [f["action"] for f in doc["fixes"]] == [f["action"] for f in mori["fixes"]]
    assert doc["fixes"][0]["action"] == (
        "grow node 1's 2048 kB pool to 512 pages (512 needed there, 0 free)"
    )
    assert doc["fixes_not_helping"] == mori["fixes_not_helping"] == []


def test_an_oom_touched_page_by_page_is_explained_for_the_whole_buffer(
    capsys: pytest.CaptureFixture[str], tiny_builds: dict[str, str]
) -> None:
    """Kernel 5.10 has no MADV_POPULATE_WRITE: the test allocator touches 100 GiB by hand, block
    by block through the interposer, until node 1's 62 GiB are gone. The why is the buffer's
    (was: "needs 0.03 GiB on node 1, which had 0.02 GiB free", the last block's view)."""
    argv = ["replay", str(D / "pool-on-node0-5.10.0"), "--size", "100GiB", "--backing"]
    argv += ["Anonymous", "--numa-node", "1", "--json", "--allocator"]
    doc = _json(capsys, [*argv, tiny_builds["wrap"]], 0)
    assert (doc["outcome"], doc["signal"]) == ("crashed", "SIGKILL")
    assert doc["causes"][0] == (  # the cause of the kill first (explain.deciding_first)
        "out of memory: prefault touch needs 100 GiB on node 1, which had 62 GiB free and 0 GiB "
        "of reclaimable page cache and slab; after 62 GiB the kernel's OOM killer ends the "
        "process (SIGKILL)"
    )
    assert doc["causes"] == _json(capsys, [*argv, "mori-624002c"], 0)["causes"]


def test_replay_text_names_the_allocator_and_one_server_runs_every_simulation(
    capsys: pytest.CaptureFixture[str],
    tiny_builds: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from umbp_sim.external import runner as runner_mod

    started: list[str] = []
    real_init = runner_mod.ExternalRunner.__init__

    def counting_init(self, spec, *args, **kwargs):  # type: ignore[no-untyped-def]
        started.append(spec.name)
        real_init(self, spec, *args, **kwargs)

    monkeypatch.setattr(runner_mod.ExternalRunner, "__init__", counting_init)
    tiny = tiny_builds["preload"]
    assert main(["replay", *PER_NODE, "--allocator", tiny]) == 0
    out = capsys.readouterr().out
    assert f"allocator: {tiny}\n" in out
    assert "error: killed by SIGBUS during prefault touch of node 1 (2048 kB pages): no free" in out
    assert "simulated: ok: AnonymousHugetlb on node 1" in out  # a fix, re-run on the build
    assert started == [tiny]  # one allocator process for the replay and every fix
    from umbp_sim.external.observe import _RUNNERS

    assert not _RUNNERS  # ended when the command returned


@pytest.mark.torch
def test_replay_sglang_request_on_the_build(
    capsys: pytest.CaptureFixture[str], tiny_builds: dict[str, str]
) -> None:
    llama = ["--model-layers", "32", "--kv-heads", "8", "--head-dim", "128", "--page-size", "64"]
    argv = ["replay", str(D / "no-pool-512g"), *llama, "--hicache-size", "2", "--sglang", "0.5.23"]
    doc = _json(capsys, [*argv, "--allocator", tiny_builds["wrap"], "--json"], 0)
    assert (doc["outcome"], doc["actual_backing"]) == ("demoted", "Anonymous")
    assert doc["warnings"][0].startswith("hugetlb failed for size=2004877312 (Cannot allocate")
    assert doc["warnings"][1].startswith("UMBPHostTensorAllocator: requested UMBPHostBufferBacking")
    assert doc["fixes"][0]["commands"] == ["sysctl -w vm.nr_hugepages=956"]
    assert doc["fixes"][0]["outcome"] == "ok"


@pytest.mark.torch  # start_host_pool makes torch tensors
def test_an_sglang_request_killed_on_the_build_keeps_the_host_check(
    capsys: pytest.CaptureFixture[str], tiny_builds: dict[str, str]
) -> None:
    """The server hosting sglang dies (SIGBUS on node 1, its pool empty): what sglang's host
    check read before comes back with the death (was: lost, so the why had no host-check line)."""
    llama = ["--model-layers", "32", "--kv-heads", "8", "--head-dim", "128", "--page-size", "64"]
    argv = ["replay", str(D / "pool-on-node0-6.8.0"), *llama, "--hicache-size", "1", "--env"]
    argv += ["SGLANG_HICACHE_HOST_NUMA_NODE=1", "--env", "SGLANG_HICACHE_HOST_HUGEPAGE=1", "--json"]
    doc = _json(capsys, [*argv, "--allocator", tiny_builds["wrap"]], 0)
    assert (doc["outcome"], doc["signal"], doc["crash_node"]) == ("crashed", "SIGBUS", 1)
    assert doc["causes"][0].startswith("sglang's host check passes: it needs the 1006632960 bytes")
    mori = _json(capsys, [*argv, "--allocator", "mori-624002c"], 0)
    assert doc["causes"] == mori["causes"]


def test_preflight_root_exit_code_on_the_build(tiny_builds: dict[str, str]) -> None:
    argv = ["preflight", "--root", *PER_NODE, "--allocator", tiny_builds["wrap"]]
    assert main([*argv, "--json"]) == 2  # crashes
    fine = ["preflight", "--root", str(D / "pool-on-node0-6.8.0"), "--size", "1GiB"]
    assert main([*fine, "--numa-node", "0", "--allocator", tiny_builds["wrap"], "--json"]) == 0


def test_preflight_verify_allocates_with_the_build(
    capsys: pytest.CaptureFixture[str], tiny_builds: dict[str, str]
) -> None:
    tiny = tiny_builds["preload"]
    argv = ["preflight", "--size", "1MiB", "--backing", "anonymous", "--numa-node", "0"]
    doc = _json(capsys, [*argv, "--allocator", tiny, "--verify", "--json"], 0)
    v = doc["verify"]
    assert doc["allocator"] == v["allocator"] == tiny
    assert v["agree"] is True
    real = v["real"]
    # The build ran on the real kernel: its buffer is bound (numa_maps says bind:0) and touched.
    assert (real["outcome"], real["actual_backing"], real["node"], real["rss"]) == (
        "ok",
        "Anonymous",
        0,
        1 << 20,
    )


@pytest.mark.parametrize(
    "value, message",
    [
        ("nosuchmodule", "unknown allocator profile 'nosuchmodule': use one of umbp-sim, "
                         "mori-624002c (or 'mori'), a path to a built .so, or an importable "
                         "module (no module named 'nosuchmodule')"),
        ("/nonexistent/x.so", "--allocator '/nonexistent/x.so': no such file"),
        ("json", "--allocator json: cannot run it: ImportError: json: no UMBPHostMemAllocator"),
    ],
)  # fmt: skip
def test_an_allocator_that_cannot_run_is_one_line_exit_64(
    capsys: pytest.CaptureFixture[str], value: str, message: str
) -> None:
    try:
        code = main(["replay", *PER_NODE, "--allocator", value])
    except SystemExit as e:  # argparse's own errors exit
        code = e.code
    assert code == 64
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_admin_writes_are_data_applied_in_the_allocators_process(
    tiny_builds: dict[str, str],
) -> None:
    """A fix's admin writes (``PoolWrite``) go with the run as data: the external build's
    process applies them to its own fresh host, as the built-in run does in this one, with the
    same host state and the same note for what the kernel would not do."""
    from umbp_sim import Machine, run_router
    from umbp_sim.diagnose.pool_writes import PoolWrite
    from umbp_sim.engine.spec import Alloc, Run
    from umbp_sim.request import AllocRequest

    m = Machine.x86_64(nodes=2, mem_per_node="8GiB")
    writes = (
        PoolWrite("nr_hugepages", 2 << 20, 64, 1),
        PoolWrite("nr_hugepages", 2 << 20, 1 << 20, 0),  # more than node 0 has: a note
    )
    counters = ("node1.hugepages.2MiB.total", "node0.hugepages.2MiB.total")
    work = Alloc(AllocRequest(4 << 20, "AnonymousHugetlb", numa_node=1))
    got = {}
    for allocator in ("mori-624002c", tiny_builds["preload"]):
        rec = run_router.run(Run(m, work, allocator=allocator, changes=writes, counters=counters))
        got[allocator] = (rec.outcome, rec.counters, rec.setup_notes)
    built_in, external = got.values()
    assert built_in == external
    assert built_in[0] == "ok" and built_in[1]["node1.hugepages.2MiB.total"] == 64
    assert built_in[2] and built_in[2][0].startswith("the kernel made only ")
