"""Every external run is bounded and every process it starts is owned (issue 26, points 2, 3).

The allocators here are small Python modules with mori's surface, written to tmp_path, whose
``alloc`` misbehaves by request size: sleeps, spins, stops itself (SIGSTOP), reads stdin, forks
a child that sleeps holding every fd, prints, or hangs in ``free``; others print or block at
import. Each command runs as a subprocess with a time limit of its own, so a hang fails the
test instead of stopping the suite; processes are counted by session (the command is started
in a new one, and nothing it starts leaves it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import MORI_SURFACE, session_processes

ROOT = Path(__file__).resolve().parent.parent.parent
REPLAY = ROOT / "tests" / "data" / "replay" / "pool-on-node0-6.8.0"

ALLOCATOR = """
import enum, mmap, ctypes, os, signal, sys, time


{surface}

HOSTILE = {HOSTILE}


def misbehave(size):
    what = HOSTILE and {{
        1: "sleep", 4095: "spin", 4096: "stop", 3145728: "stdin", 1073741824: "fork",
        1099511627776: "print",
    }}.get(size)
    if what == "sleep":
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C does not end it either
        time.sleep(1e6)
    elif what == "spin":
        while True:
            pass
    elif what == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif what == "stdin":
        sys.stdin.read()
    elif what == "fork":
        r, w = os.pipe()
        if os.fork() == 0:
            with open(os.environ["FORKED_PIDS"], "a") as f:
                f.write(f"{{os.getpid()}}\\n")
            os.write(w, b"x")
            time.sleep(1e6)
        os.read(r, 1)  # it is written down before alloc returns (and the run can end)
    elif what == "print":
        print("garbage from alloc")
        sys.stdout.flush()


class UMBPHostMemAllocator:
    def alloc(self, size, backing, hugepage_size=0, numa_node=-1, prefault=True):
        misbehave(size)
        n = max(4096, (min(size, 1 << 20) + 4095) // 4096 * 4096)
        return Handle(mmap.mmap(-1, n), size)

    def free(self, h):
        if HOSTILE and h.requested_size == 2**63:
            time.sleep(1e6)
        h.ptr = h.requested_size = h.mapped_size = 0  # as mori's Free leaves a handle
""".replace("{surface}", MORI_SURFACE)

# An allocator that behaves under simulation and hangs in alloc on the real kernel (no
# interposer, or an inactive one: preflight --verify's real allocation), SIGINT ignored.
HANG_REAL = """
_alloc = UMBPHostMemAllocator.alloc


def _alloc_or_hang(self, *args, **kwargs):
    active = getattr(ctypes.CDLL(None), "umbp_sim_interposer_fault_path", lambda: 0)
    if active() == 0:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with open(os.environ["FORKED_PIDS"], "a") as f:  # hanging: the test may signal now
            f.write(f"{os.getpid()}\\n")
        time.sleep(1e6)
    return _alloc(self, *args, **kwargs)


UMBPHostMemAllocator.alloc = _alloc_or_hang
"""

# An allocator that hangs in every alloc.
HANG_ALL = """
def _hang(self, *args, **kwargs):
    time.sleep(1e6)


UMBPHostMemAllocator.alloc = _hang
"""

# One run per behaviour: the sizes misbehave() looks at, on one host.
RUNS = (
    "[[]ample k6.8.0] alloc(size=*, Anonymous, hugepage_size=2097152, numa_node=-1, prefault=True)"
)


@pytest.fixture
def allocators(tmp_path: Path) -> dict[str, str]:
    """{"env": the environment to run umbp-sim in} with these modules importable: ``good``
    (behaves), ``hostile`` (misbehaves by size), ``loud`` (prints at import), ``stuck``
    (blocks at import), ``pkg.mod`` (a package whose ``__init__`` leaves a mark and fails)."""
    (tmp_path / "good.py").write_text(ALLOCATOR.format(HOSTILE=False))
    (tmp_path / "hostile.py").write_text(ALLOCATOR.format(HOSTILE=True))
    (tmp_path / "loud.py").write_text(
        "print('garbage at import')\n" + ALLOCATOR.format(HOSTILE=False)
    )
    (tmp_path / "stuck.py").write_text("import time\ntime.sleep(1e6)\n")
    (tmp_path / "stuck_counted.py").write_text(  # each import written down, then stuck
        "import os, time\n"
        "with open(os.environ['FORKED_PIDS'], 'a') as f:\n"
        "    f.write(f'{os.getpid()}\\n')\n"
        "time.sleep(1e6)\n"
    )
    (tmp_path / "hang_real.py").write_text(ALLOCATOR.format(HOSTILE=False) + HANG_REAL)
    (tmp_path / "hang_all.py").write_text(ALLOCATOR.format(HOSTILE=False) + HANG_ALL)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text(
        "import os\n"
        f"open({str(tmp_path / 'pkg-imported-by')!r} + str(os.getpid()), 'w').close()\n"
        "raise RuntimeError('pkg/__init__.py ran')\n"
    )
    (tmp_path / "pkg" / "mod.py").write_text(ALLOCATOR.format(HOSTILE=False))
    return {"dir": str(tmp_path), "forked": str(tmp_path / "forked-pids")}


def _env(allocators: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    # the test allocators' directory; umbp_sim itself is the installed package (never the
    # source tree, which has no compiled _native)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (allocators["dir"], env.get("PYTHONPATH")) if p)
    env["FORKED_PIDS"] = allocators["forked"]
    env.pop("UMBP_SIM_TRACEBACK", None)
    return env


def _cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "umbp_sim.cli", *args]


def _umbp_sim(
    allocators: dict[str, str], *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``umbp-sim ARGS`` in a new session; fails (not hangs) past ``timeout``, and checks that
    nothing it started is left running."""
    proc = subprocess.Popen(
        _cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=_env(allocators), start_new_session=True, cwd=allocators["dir"],
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"umbp-sim {' '.join(args)} still running after {timeout} s")
    _assert_nothing_left(proc.pid)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    done.pid = proc.pid  # type: ignore[attr-defined]
    return done


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process (a zombie is not: where init does not reap, it stays)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _assert_nothing_left(sid: int, wait: float = 10) -> None:
    deadline = time.monotonic() + wait
    while (left := session_processes(sid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if left:
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert left == [], [Path(f"/proc/{p}/cmdline").read_bytes()[:200] for p in left]


# ---- point 2: every run bounded -----------------------------------------------------------------


def test_each_hostile_run_is_an_outcome_and_the_next_run_goes_on(
    allocators: dict[str, str],
) -> None:
    """Sleep, spin, SIGSTOP and a hang in free end as outcomes naming the stage; reading stdin,
    a fork that holds every fd, a print: the run ends as the good one's. --jobs 1 and 2 give
    the same bytes; the forked child is gone."""
    argv = ["compare", "good", "hostile", "--matrix", "quick", "--no-scenarios", "-k", RUNS]
    argv += ["--run-timeout", "2", "--json"]
    serial = _umbp_sim(allocators, *argv, "--jobs", "1")
    parallel = _umbp_sim(allocators, *argv, "--jobs", "2")
    assert (serial.returncode, serial.stderr) == (1, "")
    assert (parallel.returncode, parallel.stderr) == (1, "")
    assert parallel.stdout == serial.stdout
    doc = json.loads(serial.stdout)
    assert doc["runs"] == 13  # 8 sizes, the nodes group's 4 MiB, the 4 TOP_SIZES
    got = {d["run"].split("size=")[1].split(",")[0]: d["b"] for d in doc["differences"]["outcome"]}
    assert got == {
        "1": "timed out after 2 s in alloc",
        "4095": "timed out after 2 s in alloc",
        "4096": "crash SIGSTOP in alloc",
        "9223372036854775808": "timed out after 2 s in free",
    }
    forked = [int(p) for p in Path(allocators["forked"]).read_text().split()]
    assert len(forked) == 2  # one per command
    assert not [p for p in forked if _running(p)]


def test_a_print_at_import_does_not_reach_the_protocol(allocators: dict[str, str]) -> None:
    r = _umbp_sim(allocators, "compare", "good", "loud", "--matrix", "none", "-k", "node-63")
    assert (r.returncode, r.stderr) == (0, "")
    assert "no differences" in r.stdout


# At import, a frame on every pipe the process holds (the server's channel to umbp-sim among
# them): a pickle that would run a shell command where it is loaded.
FORGER = """
import os, pickle, stat, struct
class Act:
    def __reduce__(self):
        return (os.system, ("touch " + {mark!r},))
payload = pickle.dumps({{"ready": True, "mode": "x", "objects": [], "x": Act()}})
for name in os.listdir("/proc/self/fd"):
    try:
        if stat.S_ISFIFO(os.fstat(int(name)).st_mode):
            os.write(int(name), struct.pack(">I", len(payload)) + payload)
    except OSError:
        pass
"""


def test_a_forged_message_is_refused_not_run(allocators: dict[str, str], tmp_path: Path) -> None:
    """Allocator code can write on the server's protocol fd: what it writes is read as data
    (umbp-sim's own data classes only), never as code run in umbp-sim's process."""
    mark = tmp_path / "ran"
    forger = Path(allocators["dir"]) / "forger.py"
    forger.write_text(FORGER.format(mark=str(mark)) + ALLOCATOR.format(HOSTILE=False))
    r = _umbp_sim(allocators, "compare", "umbp-sim", "forger", "--matrix", "none", "-k", "node-63")
    assert not mark.exists()
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.startswith("umbp-sim compare: forger: ")
    # a pickle is no message at all now (umbp_sim/external/wire.py): nothing of it is loaded
    assert "a message that is not UTF-8 text" in r.stderr, r.stderr
    assert len(r.stderr.splitlines()) == 1


@pytest.mark.parametrize(
    ("first", "why"),
    [
        ("None", "a NoneType where a stage or the ready message was due"),
        ("{'ready': True, 'mode': 'x'}", "a ready message without its mode or registry"),
        ("{'stage': 7}", "a stage that is not a string"),
    ],
)
def test_a_start_up_message_that_is_not_the_servers_is_one_line(
    allocators: dict[str, str], first: str, why: str
) -> None:
    """A well-formed frame of the allocator's own on the protocol fd, read as the server's
    start-up message: one line, the allocator could not run (not exit 70)."""
    module = Path(allocators["dir"]) / "first.py"
    module.write_text(
        "import json, os, sys\n"
        "from umbp_sim.external.procs import frame\n"
        "from umbp_sim.external.wire import encode\n"
        f"os.write(json.loads(sys.argv[1])['fds'][1], frame(encode({first})))\n"
    )
    r = _umbp_sim(allocators, "compare", "umbp-sim", "first", "-k", "node-63")
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == (
        "umbp-sim compare: first: its channel to umbp-sim carried a message that is not "
        f"umbp-sim's: {why}\n"
    )


def test_a_blocking_import_is_bounded(allocators: dict[str, str]) -> None:
    r = _umbp_sim(allocators, "compare", "umbp-sim", "stuck", "--run-timeout", "2")
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == "umbp-sim compare: stuck: timed out after 2 s in import (--run-timeout)\n"
    argv = ["replay", str(REPLAY), "--size", "4MiB", "--allocator", "stuck", "--run-timeout", "2"]
    r = _umbp_sim(allocators, *argv)
    assert (r.returncode, r.stdout) == (75, "")
    assert r.stderr == (
        "umbp-sim replay: --allocator stuck: timed out after 2 s in import (--run-timeout)\n"
    )


def test_an_import_past_the_limit_is_waited_for_once(allocators: dict[str, str]) -> None:
    """compare asks each allocator whether it has the shm registry before its runs: an import
    past --run-timeout there is the answer, not a wait the runs repeat."""
    r = _umbp_sim(allocators, "compare", "umbp-sim", "stuck_counted", "--run-timeout", "2")
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == (
        "umbp-sim compare: stuck_counted: timed out after 2 s in import (--run-timeout)\n"
    )
    assert len(Path(allocators["forked"]).read_text().splitlines()) == 1  # imported once


def test_replay_and_run_past_the_limit(allocators: dict[str, str], tmp_path: Path) -> None:
    """replay: one line, exit 75; run: the scenario fails with the text, the next one runs."""
    argv = ["replay", str(REPLAY), "--size", "1", "--backing", "anonymous", "--allocator"]
    r = _umbp_sim(allocators, *argv, "hostile", "--run-timeout", "2")
    assert (r.returncode, r.stdout) == (75, "")
    assert r.stderr == (
        "umbp-sim replay: --allocator hostile: a run timed out after 2 s in alloc (--run-timeout)\n"
    )
    for name, size in (("a-hangs", "1"), ("b-runs", "4194304")):
        (tmp_path / f"{name}.toml").write_text(
            f"umbp_sim_scenario = 1\n[scenario]\nname = '{name}'\ndescription = 'd'\n"
            "source = 's'\n[machine]\nnodes = 1\nmem_per_node = '16GiB'\n"
            f"[request]\nkind = 'alloc'\nsize = {size}\nbacking = 'Anonymous'\n"
            "[expect]\noutcome = 'ok'\n"
        )
    r = _umbp_sim(allocators, "run", str(tmp_path), "--allocator", "good", "--run-timeout", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    argv = ["run", str(tmp_path / "a-hangs.toml"), str(tmp_path / "b-runs.toml")]
    r = _umbp_sim(allocators, *argv, "--allocator", "hostile", "--run-timeout", "2")
    assert r.returncode == 1
    assert "  timed out after 2 s in alloc (--run-timeout)\n" in r.stdout
    rows = {line.split()[0]: line.split()[1:] for line in r.stdout.splitlines() if line}
    assert rows["a-hangs"] == ["ok", "timeout", "FAIL"]
    assert rows["b-runs"] == ["ok", "ok", "Anonymous", "PASS"]
    assert "1 passed, 1 failed" in r.stdout


def test_preflight_verify_real_allocation_is_bounded(allocators: dict[str, str]) -> None:
    """--verify's real allocation on an external build is a run like the others: past
    --run-timeout it is one line naming the stage, exit 75, and nothing of it is left."""
    argv = ["preflight", "--size", "8MiB", "--backing", "anonymous", "--allocator", "hang_real"]
    started = time.monotonic()
    r = _umbp_sim(allocators, *argv, "--verify", "--run-timeout", "2", timeout=30)
    assert time.monotonic() - started < 30
    assert (r.returncode, r.stdout) == (75, ""), r.stderr
    assert r.stderr == (
        "umbp-sim preflight: --allocator hang_real: a run timed out after 2 s in alloc "
        "(--run-timeout)\n"
    )


def test_a_module_spec_is_not_imported_here(allocators: dict[str, str]) -> None:
    """`--allocator pkg.mod` is found without running pkg/__init__.py in umbp-sim's process
    (the allocator's process imports it: one line); `--allocator this` is one line too."""
    argv = ["replay", str(REPLAY), "--size", "4MiB", "--allocator"]
    r = _umbp_sim(allocators, *argv, "pkg.mod")
    assert (r.returncode, r.stdout) == (64, "")
    assert r.stderr == (
        "umbp-sim replay: --allocator pkg.mod: cannot run it: RuntimeError: pkg/__init__.py ran\n"
    )
    marks = [p.name for p in Path(allocators["dir"]).iterdir() if p.name.startswith("pkg-imp")]
    assert marks  # the allocator's process ran it, umbp-sim's did not
    assert f"pkg-imported-by{r.pid}" not in marks  # type: ignore[attr-defined]
    r = _umbp_sim(allocators, *argv, "this")
    assert (r.returncode, r.stdout) == (64, "")
    assert r.stderr == (
        "umbp-sim replay: --allocator this: cannot run it: ImportError: this: no "
        "UMBPHostMemAllocator\n"
    )


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
@pytest.mark.parametrize("command", ["compare", "run", "replay", "preflight"])
def test_a_bad_run_timeout_is_a_usage_error(
    command: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from umbp_sim.cli import main

    argv = {"compare": ["compare", "umbp-sim", "mori"], "run": ["run"]}.get(
        command, [command, "--size", "4MiB"]
    )
    with pytest.raises(SystemExit) as e:
        main([*argv, f"--run-timeout={value}"])
    assert e.value.code == 64
    err = capsys.readouterr().err
    assert "argument --run-timeout: " in err and len(err.splitlines()) == 1


# ---- point 3: every process owned ---------------------------------------------------------------


def _start(allocators: dict[str, str], *args: str, up: int) -> subprocess.Popen[str]:
    """``umbp-sim ARGS`` in a new session, once ``up`` processes of it are running."""
    proc = subprocess.Popen(
        _cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=_env(allocators), start_new_session=True, cwd=allocators["dir"],
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while len(session_processes(proc.pid)) < up:
        if proc.poll() is not None or time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"did not start: {proc.communicate()}")
        time.sleep(0.1)
    time.sleep(0.5)
    return proc


# compare --jobs 2 over hung runs: compare, 2 workers, 4 servers and their 4 keepers, 2 runs
HUNG = ["compare", "good", "hostile", "--no-scenarios", "-k", "*alloc(size=1, *", "--jobs", "2"]


@pytest.mark.parametrize(
    ("sig", "code"),
    [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGUSR1, 138), (signal.SIGKILL, -9)],
)
def test_a_signal_to_compare_ends_everything_it_started(
    allocators: dict[str, str], sig: int, code: int
) -> None:
    """SIGTERM/SIGHUP to compare's process alone (what timeout(1), a cancelled CI job, a closed
    terminal send), or a stray SIGUSR1: it ends its workers, their servers, the runs and exits
    128 + signal; its death (SIGKILL) takes them down too."""
    proc = _start(allocators, *HUNG, up=13)
    os.kill(proc.pid, sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == code, err
    if sig != signal.SIGKILL:
        assert out == ""
        name = signal.Signals(sig).name
        assert err.startswith(f"umbp-sim compare: terminated by {name} after 0 of ")
    _assert_nothing_left(proc.pid)


def test_ctrl_c_with_a_hung_allocator_leaves_no_process(allocators: dict[str, str]) -> None:
    """The hung run ignores SIGINT; Ctrl-C (the terminal's whole group) still ends it."""
    proc = _start(allocators, *HUNG[:-1], "1", up=6)  # compare, 2 servers, 2 keepers, a run
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 2, err
    assert err.startswith("umbp-sim compare: interrupted after 0 of ")
    _assert_nothing_left(proc.pid)


@pytest.mark.parametrize(
    ("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)]
)
def test_a_signal_to_preflight_verify_ends_its_real_allocation(
    allocators: dict[str, str], sig: int, code: int
) -> None:
    argv = ["preflight", "--size", "8MiB", "--backing", "anonymous", "--allocator", "hang_real"]
    proc = _start(allocators, *argv, "--verify", up=1)
    marks = Path(allocators["forked"])
    deadline = time.monotonic() + 60
    while not (marks.exists() and marks.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marks.exists(), "the real allocation did not start"
    os.kill(proc.pid, sig)
    out, err = proc.communicate(timeout=30)
    assert (proc.returncode, out) == (code, ""), err
    _assert_nothing_left(proc.pid)


def test_sigterm_to_replay_ends_its_allocator(allocators: dict[str, str]) -> None:
    argv = ["replay", str(REPLAY), "--size", "1", "--backing", "anonymous"]
    proc = _start(allocators, *argv, "--allocator", "hostile", up=4)  # replay, server, keeper, run
    os.kill(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert (proc.returncode, out, err) == (143, "", "umbp-sim replay: terminated by SIGTERM\n")
    _assert_nothing_left(proc.pid)


def test_runs_in_a_row_timed_out_in_one_stage_stop_compare(allocators: dict[str, str]) -> None:
    """issue 41: an allocator that hangs in every alloc cost the run limit per run; 3 runs in a
    row timed out in the same stage stop compare (exit 2, one line), with --jobs 1 and 2;
    --keep-going runs them all. Nothing is left running."""
    argv = ["compare", "good", "hang_all", "--matrix", "quick", "--no-scenarios", "-k", RUNS]
    argv += ["--run-timeout", "1"]
    for jobs in ("1", "2"):
        done = _umbp_sim(allocators, *argv, "--jobs", jobs)
        assert (done.returncode, done.stdout) == (2, ""), done.stderr
        assert done.stderr == (
            "umbp-sim compare: hang_all: 3 runs in a row timed out after 1 s in alloc; stopped "
            "after 3 of 13 runs (--keep-going runs them all)\n"
        )
    every = _umbp_sim(allocators, *argv, "--jobs", "2", "--keep-going", "--json")
    assert (every.returncode, every.stderr) == (1, "")
    outcome = json.loads(every.stdout)["differences"]["outcome"]
    assert [d["b"] for d in outcome] == ["timed out after 1 s in alloc"] * 13
