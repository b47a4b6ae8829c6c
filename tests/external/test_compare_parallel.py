"""compare --jobs N (byte-identical results, clean ends), the "numa binding" class, and --env
reaching an external allocator's process (compare, a raw replay, a scenario's [env])."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import session_processes

from umbp_sim.allocator_spec import parse_allocator_spec
from umbp_sim.cli import main
from umbp_sim.comparison import matrix, parallel
from umbp_sim.external.observe import close_runners
from umbp_sim.run_router import open_allocator
from umbp_sim.scenario.external_scenario import run_scenario_external
from umbp_sim.scenario.schema import load_scenario

REPLAY = Path(__file__).resolve().parent.parent / "data" / "replay"


def _out(capsys: pytest.CaptureFixture[str], argv: list[str], code: int) -> str:
    assert main(argv) == code
    out = capsys.readouterr()
    assert out.err == ""
    return out.out


def test_jobs_1_and_2_give_the_same_bytes(
    tiny_builds: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Runs spread over two workers (each with its own allocator server) merge in run order."""
    argv = ["compare", "umbp-sim", tiny_builds["wrap"], "--no-scenarios"]
    argv += ["-k", "*pool-on-node0 k6.8.0*", "--examples", "3"]
    serial_json = _out(capsys, [*argv, "--json", "--jobs", "1"], 1)
    parallel_json = _out(capsys, [*argv, "--json", "--jobs", "2"], 1)
    assert parallel_json == serial_json
    doc = json.loads(serial_json)
    assert doc["runs"] > 50 and doc["differing_runs"] > 0
    assert _out(capsys, [*argv, "--jobs", "2"], 1) == _out(capsys, [*argv, "--jobs", "1"], 1)


def test_bad_jobs_and_env_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "umbp-sim", "mori", "--jobs", "0"]) == 64
    assert capsys.readouterr().err == "umbp-sim compare: --jobs 0: must be at least 1\n"
    assert main(["compare", "umbp-sim", "mori", "--env", "NOEQUALS"]) == 64
    assert capsys.readouterr().err == "umbp-sim compare: --env 'NOEQUALS': expected NAME=VALUE\n"


def test_a_binding_to_the_wrong_node_is_its_own_class(
    tiny_builds: dict[str, str],
    tiny_planted: dict[str, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The planted build binds node 0's buffer to node 1: on a host with pools on both nodes
    nothing else differs (same backing, sizes, warnings), only where the pages are."""
    argv = ["compare", tiny_builds["wrap"], tiny_planted["wrong_node"], "--no-scenarios"]
    argv += ["-k", "[[]ample k6.8.0] *Hugetlb*numa_node=0, prefault=True)", "--json"]
    doc = json.loads(_out(capsys, [*argv, "--jobs", "2"], 1))
    assert set(doc["differences"]) == {"numa binding"}
    by_run = {d["run"]: (d["a"], d["b"]) for d in doc["differences"]["numa binding"]}
    run = (
        "[ample k6.8.0] alloc(size=4194304, AnonymousHugetlb, hugepage_size=2097152, "
        "numa_node=0, prefault=True)"
    )
    assert by_run[run] == (
        "bind 0; hugepages 2 x 2MiB on node 0",
        "bind 1; hugepages 2 x 2MiB on node 1",
    )


def test_the_builtin_profiles_differ_in_binding_where_mori_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/deployed-behaviour.md row 4: mori never binds node 63 (maxnode drops its bit)."""
    argv = ["compare", "umbp-sim", "mori", "--matrix", "none", "-k", "node-63", "--json"]
    doc = json.loads(_out(capsys, [*argv, "--jobs", "1"], 1))
    [item] = doc["differences"]["numa binding"]
    where = item.pop("where")
    assert item == {"run": "scenario node-63-never-bound.toml: node-63-never-bound",
                    "a": "bind 63", "b": "default"}  # fmt: skip
    # Where they part: umbp-sim reads the possible nodes, then binds; mori's mask drops node 63
    # (the built-in allocators' calls have no call site).
    assert where["call"] == 2 and where["site_a"] is where["site_b"] is None
    assert where["a"][:2] == ['read_file("/sys/devices/system/node/possible") = 5',
                              "mbind(0x..., 67108864, MPOL_BIND, [63], 65, 0) = 0"]  # fmt: skip
    assert (
        where["b"][0]
        == "mbind(0x..., 67108864, MPOL_BIND, [], 64, 0) = -1 EINVAL (Invalid argument)"
    )


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_env_reaches_the_allocator_at_alloc_time_in_compare(
    tiny_planted: dict[str, str], capsys: pytest.CaptureFixture[str], jobs: str
) -> None:
    """compare --env: set in the external allocator's process (the serial path's server, each
    worker's server); the probe warns only when it sees MORI_UMBP_LOG_LEVEL."""
    argv = ["compare", "umbp-sim", tiny_planted["env_probe"], "--no-scenarios", "--json"]
    argv += ["-k", "[[]ample k6.8.0] alloc(size=4096, Anonymous, *", "--jobs", jobs]
    doc = json.loads(_out(capsys, [*argv, "--env", "MORI_UMBP_LOG_LEVEL=debug"], 1))
    assert doc["runs"] == 2 and doc["differing_runs"] == 2
    assert [(d["a"], d["b"]) for d in doc["differences"]["warning count"]] == [(0, 1), (0, 1)]
    # No level given: compare runs mori at warn (its warnings printed, as the built-in's are
    # collected); a mori level set by --env or inherited is left alone.
    default = json.loads(_out(capsys, argv, 1))["differences"]["warning count"]
    assert [(d["a"], d["b"]) for d in default] == [(0, 1), (0, 1)]
    quiet = [*argv, "--env", "MORI_GLOBAL_LOG_LEVEL=error"]
    assert json.loads(_out(capsys, quiet, 0))["same"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MORI_GLOBAL_LOG_LEVEL", "error")
        assert json.loads(_out(capsys, argv, 0))["same"]


def test_a_run_carries_its_own_env(tiny_planted: dict[str, str]) -> None:
    """A scenario's [env] goes with its run, over the server's environment."""
    run = next(r for r in matrix.quick() if r.label.startswith("[ample k6.8.0] alloc(size=4096, "))
    runner = open_allocator(parse_allocator_spec(tiny_planted["env_probe"]))
    try:
        got = runner.run(dataclasses.replace(run, env=(("MORI_UMBP_LOG_LEVEL", "info"),)))
        unset = runner.run(run)
    finally:
        runner.close()
    assert got.warnings == ["MORI_UMBP_LOG_LEVEL=info at alloc"]
    assert unset.warnings == []


def test_env_reaches_the_allocator_in_a_raw_replay(
    tiny_planted: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["replay", str(REPLAY / "pool-on-node0-6.8.0"), "--size", "4MiB", "--backing"]
    argv += ["anonymous", "--allocator", tiny_planted["env_probe"], "--json"]
    assert main([*argv, "--env", "MORI_UMBP_LOG_LEVEL=warn"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["warnings"] == ["MORI_UMBP_LOG_LEVEL=warn at alloc"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["warnings"] == []


def test_a_scenario_env_reaches_the_allocator(tiny_planted: dict[str, str], tmp_path: Path) -> None:
    scn = tmp_path / "env.toml"
    scn.write_text(
        "umbp_sim_scenario = 1\n[scenario]\nname = 'env'\ndescription = 'd'\nsource = 's'\n"
        "[machine]\nnodes = 1\nmem_per_node = '16GiB'\n[env]\nMORI_UMBP_LOG_LEVEL = 'info'\n"
        "[request]\nkind = 'alloc'\nsize = '4MiB'\nbacking = 'Anonymous'\n"
        "[expect]\noutcome = 'ok'\nwarnings = ['MORI_UMBP_LOG_LEVEL=info at alloc']\n"
    )
    try:
        result = run_scenario_external(load_scenario(scn), tiny_planted["env_probe"])
        # Without a level in [env] the run sets warn: mori's warnings are printed and checked.
        scn.write_text(
            scn.read_text()
            .replace("MORI_UMBP_LOG_LEVEL = 'info'", "")
            .replace("=info at", "=warn at")
        )
        default = run_scenario_external(load_scenario(scn), tiny_planted["env_probe"])
    finally:
        close_runners()
    assert result.observed.warnings == ["MORI_UMBP_LOG_LEVEL=info at alloc"]
    assert result.mismatches == []
    assert default.observed.warnings == ["MORI_UMBP_LOG_LEVEL=warn at alloc"]
    assert default.mismatches == []


# ---- ending early: Ctrl-C, a worker killed ----------------------------------------------------


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry))
    return out


def _start_long_compare(tiny: str) -> subprocess.Popen[str]:
    """A long compare (the full matrix on the test allocator) with two workers, its servers
    up: a new session, so a terminal's Ctrl-C can be sent to all of it."""
    cmd = [sys.executable, "-P", "-m", "umbp_sim.cli", "compare", "umbp-sim", tiny]
    cmd += ["--matrix", "full", "--no-scenarios", "--jobs", "2"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    deadline = time.monotonic() + 120
    # compare, 2 workers, 2 allocator servers (and their forked runs)
    while len(session_processes(proc.pid)) < 5:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.2)
    time.sleep(1.0)  # some runs under way
    return proc


def _assert_nothing_left(sid: int) -> None:
    deadline = time.monotonic() + 20
    while (left := session_processes(sid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == []


def test_ctrl_c_is_exit_2_and_leaves_no_process(tiny_builds: dict[str, str]) -> None:
    proc = _start_long_compare(tiny_builds["wrap"])
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("umbp-sim compare: interrupted after ")
    assert lines[0].endswith(" of 184320 runs (nothing compared)")
    _assert_nothing_left(proc.pid)


def test_a_worker_killed_is_exit_2_and_leaves_no_process(tiny_builds: dict[str, str]) -> None:
    proc = _start_long_compare(tiny_builds["wrap"])
    workers = _children(proc.pid)
    assert len(workers) == 2
    os.kill(workers[0], signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    assert (out, err) == ("", "umbp-sim compare: a worker process died (killed by SIGKILL)\n")
    _assert_nothing_left(proc.pid)


def test_a_worker_dead_when_its_next_chunk_is_sent_is_a_dead_worker() -> None:
    """A worker killed after its last message: sending it the next chunk is EPIPE, which was
    taken for `compare | head` (stdout's reader gone) and gave exit 0, "same"."""
    parent_end, worker_end = multiprocessing.Pipe()
    worker_end.send(("idle",))
    worker_end.close()

    class Killed:
        exitcode = -signal.SIGKILL

        def join(self, timeout: float | None = None) -> None:
            pass

    with pytest.raises(parallel.WorkerDied, match=r"^a worker process died \(killed by SIGKILL\)$"):
        list(parallel._collect([(Killed(), parent_end)], [object()] * 3, None))
