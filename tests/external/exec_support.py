"""Running ``umbp-sim exec`` from a test: a subprocess in a session of its own, with a time
limit and its own TMPDIR, checked to leave no process and no private directory behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import session_processes


def run_exec(
    tmp_path: Path, *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``umbp-sim exec ARGS`` (TMPDIR: tmp_path/tmp; ``env`` over this process's); checks that
    it left no process and no private directory behind."""
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    full = {**os.environ, **(env or {}), "TMPDIR": str(tmp)}
    full.pop("UMBP_SIM_TRACEBACK", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "umbp_sim.cli", "exec", *args], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=full, start_new_session=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"umbp-sim exec {' '.join(args)} still running after {timeout} s")
    assert_nothing_left(proc.pid)
    assert list(tmp.iterdir()) == []
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def assert_nothing_left(sid: int, wait: float = 10) -> None:
    deadline = time.monotonic() + wait
    while (left := session_processes(sid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == []


def gone(pid: int, wait: float = 10) -> bool:
    """Whether process ``pid`` is gone (or a zombie nobody reaps) within ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state == "Z":
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
