"""Everything ``umbp-sim exec`` starts ends with it (issue 43 item 7): a child that made a
session of its own (``setsid``), an orphan, the program's tree when umbp-sim is SIGKILLed (and
its private directory), and umbp-sim told to end by a signal it does not otherwise use."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .exec_support import assert_nothing_left, gone, run_exec

# Prints the pids of a child in the program's group, of one in a session of its own (setsid),
# and of an orphan in a session of its own (its parent, a subshell, exits), then waits.
# (Their output goes to /dev/null: one left behind must not hold the test's pipes.)
TREE = (
    "exec 3>&1 >/dev/null 2>&1; sleep 300 3>&- & a=$!; setsid sleep 300 3>&- & b=$!; "
    "c=$( (setsid sleep 300 >/dev/null 3>&- & echo $!) ); echo $a $b $c >&3; exec 3>&-; wait"
)


def _start(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], Path]:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "umbp_sim.cli", "exec", *args], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(tmp)},
        start_new_session=True,
    )  # fmt: skip
    return proc, tmp


def _survivors(pids: list[int], wait: float = 10) -> list[int]:
    """Those of ``pids`` still running after a wait (killed now: a failing test leaves none)."""
    left = [p for p in pids if not gone(p, wait)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    return left


def _empty_within(path: Path, wait: float = 10) -> bool:
    deadline = time.monotonic() + wait
    while list(path.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return list(path.iterdir()) == []


def test_a_setsid_child_and_an_orphan_are_ended_at_the_time_limit(tmp_path: Path) -> None:
    """A child that left the program's group (setsid) outlived --run-timeout: the group's kill
    did not reach it. The keeper, a subreaper, ends the program's whole tree."""
    done = run_exec(tmp_path, "--run-timeout", "1", "--", "sh", "-c", TREE, timeout=30)
    assert done.returncode == 75, done.stderr
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) == 3
    assert _survivors(pids) == []


def test_sigkill_to_umbp_sim_ends_the_tree_and_removes_the_host_directory(tmp_path: Path) -> None:
    """SIGKILL to umbp-sim left the program's children running and its private directory in
    $TMPDIR. Its keeper outlives it long enough to end both."""
    proc, tmp = _start(tmp_path, "--", "sh", "-c", TREE)
    pids: list[int] = []
    try:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 3
        assert len(list(tmp.iterdir())) == 1  # the host directory
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        assert _survivors(pids) == []
        assert _empty_within(tmp)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        _survivors(pids, wait=0)
    assert_nothing_left(proc.pid)


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGALRM])
def test_a_stray_signal_ends_umbp_sim_through_its_clean_up(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """A stray SIGUSR1 (whose default ends a process) ended umbp-sim at once: no clean-up. It
    ends it as SIGTERM does, the program's tree and the directory first, exit 128 + it."""
    proc, tmp = _start(tmp_path, "--", "sh", "-c", TREE)
    pids: list[int] = []
    try:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        os.kill(proc.pid, sig)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert _survivors(pids) == []
    assert proc.returncode == 128 + sig, err
    assert err == f"umbp-sim exec: terminated by {sig.name}\n"
    assert list(tmp.iterdir()) == []
    assert_nothing_left(proc.pid)


def test_the_program_gets_the_default_signal_actions(tmp_path: Path) -> None:
    """The keeper ignores the signals that would end it by accident; the program gets each
    back at its default: a SIGUSR1 to itself ends it (128 + 10)."""
    done = run_exec(tmp_path, "--", "sh", "-c", "kill -USR1 $$; echo survived")
    assert (done.returncode, done.stdout) == (128 + signal.SIGUSR1, "")
    assert "; ended by SIGUSR1. Exit status 138." in done.stderr
