"""``umbp-sim build-allocator`` bounds its compiler and what it reads (issue 43, point 5): the
compiler is a process group umbp-sim owns, ended past ``--build-timeout`` and with umbp-sim on
any signal (SIGKILL too: the keeper), limited to ``--build-memory`` of address space, its stdin
/dev/null; OUT is checked before compiling and only ever replaced whole; headers umbp-sim reads
itself are regular files under a bound.

The sources fail early on purpose (``#error``, a FIFO, a device): one test links, none builds a
module that loads.
Each command runs as a subprocess in a new session with a time limit of its own, so a hang fails
the test, and nothing it started may be left running.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import session_processes

from umbp_sim.commands import build_allocator as command
from umbp_sim.toolchain import compiler, mori_build

FAKE = Path(__file__).resolve().parent / "fake_mori"


def _start(
    tmp_path: Path, *args: str, stdin: int | None = subprocess.DEVNULL
) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env.pop("UMBP_SIM_TRACEBACK", None)
    return subprocess.Popen(
        [sys.executable, "-m", "umbp_sim.cli", "build-allocator", *args], stdin=stdin,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True, cwd=tmp_path,
    )  # fmt: skip


def _finish(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        for pid in session_processes(proc.pid):
            os.kill(pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"build-allocator still running after {timeout} s")
    _assert_nothing_left(proc.pid)
    return proc.returncode, out, err


def _build(tmp_path: Path, *args: str, timeout: float = 60) -> tuple[int, str, str]:
    return _finish(_start(tmp_path, *args), timeout)


def _assert_nothing_left(sid: int, wait: float = 10) -> None:
    deadline = time.monotonic() + wait
    while (left := session_processes(sid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == []


def _source(tmp_path: Path, text: str, name: str = "a.cpp") -> str:
    (tmp_path / name).write_text(text)
    return name


def _only(tmp_path: Path, *names: str) -> None:
    """The directory holds these files and nothing else (no temporary file or directory)."""
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)


def test_an_include_of_dev_zero_ends_at_the_memory_limit(tmp_path: Path) -> None:
    src = _source(tmp_path, '#include "/dev/zero"\n')
    start = time.monotonic()
    code, out, err = _build(tmp_path, src, "-o", "m.so", "--build-memory", "768MiB")
    assert (code, out) == (65, "")
    first = err.splitlines()[0]
    assert re.fullmatch(
        r"umbp-sim build-allocator: compiling m\.so failed: the compiler reached \d+(\.\d+)?"
        r"[MG]iB of its 768MiB of memory \(--build-memory; an #include of a device such as "
        r"/dev/zero\?\):",
        first,
    ), err[:500]
    assert time.monotonic() - start < 30
    _only(tmp_path, src)


def test_stdin_is_dev_null_and_a_fifo_include_ends_at_the_timeout(tmp_path: Path) -> None:
    # /dev/stdin reads nothing even with umbp-sim's stdin a pipe nobody closes: #error is reached
    src = _source(tmp_path, '#include "/dev/stdin"\n#error stdin was empty\n')
    proc = _start(tmp_path, src, "-o", "m.so", stdin=subprocess.PIPE)
    code, out, err = _finish(proc)
    assert (code, out) == (65, "")
    assert err.startswith("umbp-sim build-allocator: compiling m.so failed:\n"), err
    assert "stdin was empty" in err
    # A FIFO nobody writes: the compiler waits in open(2) until --build-timeout ends it.
    os.mkfifo(tmp_path / "h.fifo")
    src = _source(tmp_path, '#include "h.fifo"\n', "b.cpp")
    start = time.monotonic()
    code, out, err = _build(tmp_path, src, "-o", "m.so", "--build-timeout", "2")
    assert (code, out) == (65, "")
    assert err == (
        "umbp-sim build-allocator: compiling m.so: the compiler did not end within 2 s and was "
        "ended (--build-timeout; an #include of a FIFO or a device?)\n"
    )
    assert time.monotonic() - start < 20
    _only(tmp_path, "a.cpp", "b.cpp", "h.fifo")


def test_a_compiler_that_never_ends_is_ended_with_what_it_started(tmp_path: Path) -> None:
    cxx = tmp_path / "cxx"
    cxx.write_text("#!/bin/sh\nsleep 1000 &\nsleep 1000\n")
    cxx.chmod(0o755)
    src = _source(tmp_path, "int x;\n")
    code, out, err = _build(tmp_path, src, "-o", "m.so", "--cxx", str(cxx), "--build-timeout", "1")
    assert (code, out) == (65, "")
    assert err == (
        "umbp-sim build-allocator: compiling m.so: the compiler did not end within 1 s and was "
        "ended (--build-timeout; an #include of a FIFO or a device?)\n"
    )


def _wait_for_compiler(sid: int, timeout: float = 30) -> None:
    """Until a cc1plus runs in session ``sid`` (blocked on the FIFO its source includes)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in session_processes(sid):
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "cc1plus":
                    return
            except OSError:
                pass
        time.sleep(0.05)
    pytest.fail("no cc1plus started")


@pytest.mark.parametrize(
    ("sig", "code"),
    [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129), (signal.SIGKILL, -9)],
)
def test_a_signal_ends_the_compiler_and_leaves_no_output(
    tmp_path: Path, sig: int, code: int
) -> None:
    os.mkfifo(tmp_path / "h.fifo")
    src = _source(tmp_path, '#include "h.fifo"\n')
    (tmp_path / "m.so").write_bytes(b"the previous build")
    proc = _start(tmp_path, src, "-o", "m.so", "--build-timeout", "60")
    _wait_for_compiler(proc.pid)
    os.kill(proc.pid, sig)
    got, out, err = _finish(proc, 30)
    assert got == code, err
    if sig == signal.SIGTERM:
        assert err == "umbp-sim build-allocator: terminated by SIGTERM\n"
    _assert_nothing_left(proc.pid)
    deadline = time.monotonic() + 10  # SIGKILL: the keeper removes the temporary directory
    while len(list(tmp_path.iterdir())) > 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    _only(tmp_path, "a.cpp", "h.fifo", "m.so")
    assert (tmp_path / "m.so").read_bytes() == b"the previous build"


@pytest.mark.parametrize(
    ("target", "what"), [("fifo", "a FIFO"), ("/dev/full", "a character device")]
)
def test_an_output_that_is_not_a_regular_file_is_exit_73_before_compiling(
    tmp_path: Path, target: str, what: str
) -> None:
    if target == "fifo":
        os.mkfifo(tmp_path / "out.so")
        target = "out.so"
    src = _source(tmp_path, "#error never compiled\n")
    code, out, err = _build(tmp_path, src, "-o", target)
    assert (code, out, err) == (
        73, "", f"umbp-sim build-allocator: -o {target}: {what}, not a regular file: refused\n"
    )  # fmt: skip


def test_a_failed_build_leaves_the_previous_output_whole(tmp_path: Path) -> None:
    """A build that compiles and links but does not load (no Python module in it) is not
    moved to OUT: the previous build stays, and nothing else is left beside it."""
    (tmp_path / "m.so").write_bytes(b"the previous build")
    src = _source(tmp_path, "int not_a_module;\n")
    code, _, err = _build(tmp_path, src, "-o", "m.so")
    assert code == 65 and err.startswith(
        "umbp-sim build-allocator: m.so was built but does not "
    ), err
    _only(tmp_path, src, "m.so")
    assert (tmp_path / "m.so").read_bytes() == b"the previous build"


def test_a_source_that_is_not_a_regular_file_is_named(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "a.cpp")
    code, out, err = _build(tmp_path, "a.cpp", "-o", "m.so")
    assert (code, out, err) == (
        65, "", "umbp-sim build-allocator: a.cpp: a FIFO, not a regular file\n"
    )  # fmt: skip


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    out = tmp_path / "mori"
    shutil.copytree(FAKE, out)
    return out


def test_a_checkout_header_umbp_sim_reads_is_regular_and_bounded(
    checkout: Path, tmp_path: Path
) -> None:
    log_header = checkout / mori_build.LOG_HEADER
    log_header.unlink()
    os.mkfifo(log_header)
    code, out, err = _build(tmp_path, "--mori", str(checkout), "-o", "mori_umbp.so")
    assert (code, out, err) == (
        65, "", f"umbp-sim build-allocator: {log_header}: a FIFO, not a regular file\n"
    )  # fmt: skip
    log_header.unlink()
    with open(log_header, "wb") as f:  # 6 GiB, sparse: never read
        f.truncate(6 << 30)
    code, out, err = _build(tmp_path, "--mori", str(checkout), "-o", "mori_umbp.so")
    assert (code, out, err) == (
        65, "", f"umbp-sim build-allocator: {log_header}: 6,442,450,944 bytes, more than a "
        "source file (at most 16,777,216)\n",
    )  # fmt: skip
    header = checkout / mori_build.HEADER
    header.unlink()
    os.mkfifo(header)
    code, out, err = _build(tmp_path, "--mori", str(checkout), "-o", "mori_umbp.so")
    assert (code, out, err) == (
        65, "", f"umbp-sim build-allocator: --mori {checkout}: {mori_build.HEADER}: a FIFO, "
        "not a regular file\n",
    )  # fmt: skip


def test_bad_limits_are_usage_errors(tmp_path: Path) -> None:
    code, _, err = _build(tmp_path, "a.cpp", "-o", "m.so", "--build-timeout", "0")
    assert code == 64 and err.endswith(
        "argument --build-timeout: 0 is not a positive number of seconds (at most a year)\n"
    )
    code, _, err = _build(tmp_path, "a.cpp", "-o", "m.so", "--build-memory", "1MiB")
    assert code == 64 and err.endswith(
        "argument --build-memory: 1MiB is too little for a compiler (at least 64MiB; default "
        "4GiB)\n"
    )
    assert command.DEFAULT_TIMEOUT == compiler.DEFAULT_TIMEOUT  # --help's copy of the default


def test_umbp_sims_own_lower_limits_hold_for_the_compiler(tmp_path: Path) -> None:
    """Under an analyst's ``ulimit -v`` (hard) below --build-memory the compiler runs under
    that limit, not an exec that fails: the build is answered as any other."""
    import resource

    def ulimit_v() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    src = _source(tmp_path, "#error reached the compiler\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "umbp_sim.cli", "build-allocator", src, "-o", "m.so"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, cwd=tmp_path, preexec_fn=ulimit_v,
    )  # fmt: skip
    code, out, err = _finish(proc)
    assert (code, out) == (65, "")
    assert err.startswith("umbp-sim build-allocator: compiling m.so failed:\n"), err
    assert "reached the compiler" in err
