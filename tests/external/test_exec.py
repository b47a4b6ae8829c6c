"""``umbp-sim exec -- CMD``: any program's OS calls on a simulated host (issue 27 item 4).

The probe (exec_probe.c) asks for what an allocator with a NUMA node asks for: a 2 MiB
MAP_HUGETLB mapping bound to node 1 and touched. This box may have no hugepages and one node:
under exec it runs on the simulated host, whatever this box has. Each command runs as a
subprocess in a session of its own, with a time limit, and the test checks that nothing it
started is left and that its private directory is gone (TMPDIR is the test's own).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import session_processes

from .exec_support import assert_nothing_left, run_exec

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DUMP_POOL_ON_NODE0 = ROOT / "tests" / "data" / "replay" / "pool-on-node0-6.8.0"


# A Python program's 2 MiB MAP_HUGETLB mapping through ctypes (p: its address).
MAP_2MIB_HUGETLB = (
    "import ctypes, os\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.mmap.restype = ctypes.c_void_p\n"
    "libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t] + [ctypes.c_int] * 3 + "
    "[ctypes.c_long]\n"
    "p = libc.mmap(None, 2 << 20, 3, 0x22 | 0x40000 | (21 << 26), -1, 0)\n"
)


_exec = run_exec
_assert_nothing_left = assert_nothing_left


def _lines(out: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in out.splitlines())


def test_hugetlb_bound_to_node_1_runs_on_the_default_two_node_host(
    probe: str, tmp_path: Path
) -> None:
    """The default host: 2 nodes, 2 MiB pools on both. The program sees it (its node
    directories, /proc/meminfo) and gets its hugepage on node 1."""
    done = _exec(tmp_path, "--json", "report.json", "--", probe)
    assert done.returncode == 0, done.stderr
    assert _lines(done.stdout) == {
        "nodes": "2", "page size": "4096", "mmap": "ok", "mbind": "ok", "touch": "ok",
        "page node": "1",  # move_pages: where the simulated host put it
        "HugePages_Free": "2047",  # 2 x 1024 on the host, one taken by the touch
    }  # fmt: skip
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["host"] == "ample" and report["host_source"] == "named machine ample"
    assert report["exit_status"] == 0 and report["death"] is None
    assert report["simulated_calls"] >= 4  # sysconf, mmap, mbind, the meminfo open, munmap
    assert report["page_faults"] > 0
    assert any(line.startswith("mbind(") for line in report["trace"])
    assert done.stderr.startswith("umbp-sim exec: `")
    assert "ran on the simulated host ample (named machine ample: x86_64, 2 nodes" in done.stderr
    assert done.stderr.rstrip().endswith("Exit status 0.")


@pytest.mark.parametrize("machine", ["pool-on-node0", str(DUMP_POOL_ON_NODE0)])
def test_no_pool_on_node_1_is_a_simulated_sigbus_in_the_touch(
    probe: str, tmp_path: Path, machine: str
) -> None:
    """A host with hugepages on node 0 only (named, or a dump of one): the reservation
    succeeds, the touch on node 1 dies of SIGBUS, exec exits 128 + 7 with SimKernel's reasons."""
    done = _exec(tmp_path, "--machine", machine, "--json", "report.json", "--", probe)
    assert done.returncode == 135, done.stderr
    assert _lines(done.stdout) == {
        "nodes": "2", "page size": "4096", "mmap": "ok", "mbind": "ok",
    }  # fmt: skip
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["exit_status"] == 135 and report["ended_by"] == "SIGBUS"
    death = report["death"]
    assert death["signal"] == "SIGBUS" and death["stage"] == "page touch"
    assert death["crash"]["node"] == 1 and death["crash"]["hugepage_size"] == 2 << 20
    rules = [r["rule"] for r in death["reasons"]]
    assert "hugetlb_fault_no_page" in rules
    assert report["reasons"] == death["reasons"]
    assert "killed by a simulated SIGBUS in page touch: SIGBUS in " in done.stderr
    assert "node 1, 2048 kB pages" in done.stderr
    assert done.stderr.rstrip().endswith("Exit status 135.")


def test_a_death_in_a_process_the_program_started_is_reported(probe: str, tmp_path: Path) -> None:
    """A shell runs the probe (fork, exec): the probe dies of a simulated SIGBUS, the shell goes
    on; exec exits with the shell's status and reports the probe's death as data."""
    script = f"{probe}; echo after=$?"
    done = _exec(
        tmp_path, "--machine", "pool-on-node0", "--json", "r.json", "--", "sh", "-c", script
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "after=135"
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["death"] is None
    (other,) = [p for p in report["other_processes"] if "death" in p]
    assert other["death"]["signal"] == "SIGBUS" and other["death"]["crash"]["node"] == 1
    assert f"process {other['pid']} it started was killed by a simulated SIGBUS" in done.stderr


def test_a_fault_plan_makes_mbind_fail_in_the_program(probe: str, tmp_path: Path) -> None:
    plan = tmp_path / "plan.toml"
    plan.write_text('[[faults]]\nname = "mbind fails"\nop = "mbind"\nerrno = "EIO"\n')
    done = _exec(tmp_path, "--faults", str(plan), "--json", "report.json", "--", probe)
    assert done.returncode == 3, done.stderr
    assert _lines(done.stdout)["mbind"] == "EIO"
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["fault_rules"] == 1 and report["exit_status"] == 3
    assert any(line.startswith("mbind(") and "EIO" in line for line in report["trace"])
    assert "with 1 fault rule;" in done.stderr


def test_a_python_program_under_the_preload(tmp_path: Path) -> None:
    """A Python program: what it reads of the host is the simulated one, and a ctypes mmap of a
    2 MiB hugepage (none on this box, perhaps) is the simulated host's."""
    program = (
        "import ctypes, os\n"
        "meminfo = dict(l.split(':', 1) for l in open('/proc/meminfo'))\n"
        "print('total', meminfo['HugePages_Total'].strip())\n"
        "print('nodes', sorted(n for n in os.listdir('/sys/devices/system/node') "
        "if n.startswith('node')))\n"
        "print('exists', [os.path.exists(f'/sys/devices/system/node/node{i}') for i in range(3)])\n"
        + MAP_2MIB_HUGETLB
        + "print('mmap', 'failed' if p in (None, 2**64 - 1) else 'ok')\n"
    )
    done = _exec(tmp_path, "--json", "report.json", "--", sys.executable, "-c", program)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "total 2048", "nodes ['node0', 'node1']", "exists [True, True, False]", "mmap ok",
    ]  # fmt: skip
    report = json.loads((tmp_path / "report.json").read_text())
    assert any("MAP_HUGETLB" in line for line in report["trace"])


@pytest.mark.parametrize(
    ("then", "code", "said"),
    [
        ("ctypes.memset(p, 1, 2 << 20); print('touched')", 0, "Exit status 0."),
        ("ctypes.string_at(0)", 139, "Fatal Python error: Segmentation fault"),
    ],
)
def test_the_programs_sigsegv_handler_goes_behind_the_interposers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, then: str, code: int, said: str
) -> None:
    """On the PROT_NONE fault path every touch of a simulated page is a SIGSEGV: Python's
    faulthandler (pytest enables it) would take the first for a crash. Its handler goes behind
    the interposer's: a touch is granted, a real SIGSEGV still reaches it."""
    monkeypatch.setenv("UMBP_SIM_FAULT_PATH", "sigsegv")
    program = MAP_2MIB_HUGETLB + then + "\n"
    done = _exec(tmp_path, "--", sys.executable, "-X", "faulthandler", "-c", program)
    assert done.returncode == code, done.stderr
    assert said in done.stderr
    assert done.stdout == ("touched\n" if code == 0 else "")
    assert ("Fatal Python error" in done.stderr) == (code != 0)


def test_a_program_that_reuses_the_evidence_fd_gets_nothing_written_there(tmp_path: Path) -> None:
    """The program closes the evidence pipe's fd and opens a file under the same number, then
    dies of a simulated SIGBUS: the interposer sees that the fd is no longer the pipe and writes
    nothing into the file; the exit status is still the death's."""
    out = tmp_path / "file"
    program = (
        "import ctypes, os\n"
        "n = int(os.environ['UMBP_SIM_EXEC_EVIDENCE'].split(':')[0])\n"
        "os.close(n)\n"
        f"os.dup2(os.open({str(out)!r}, os.O_WRONLY | os.O_CREAT), n)\n"
        + MAP_2MIB_HUGETLB
        + "mask = ctypes.c_ulong(2)\n"
        "sys_mbind = {'x86_64': 237, 'aarch64': 235}[os.uname().machine]\n"
        "assert libc.syscall(sys_mbind, ctypes.c_void_p(p), ctypes.c_size_t(2 << 20), 2, "
        "ctypes.byref(mask), 64, 0) == 0\n"  # MPOL_BIND to node 1
        "ctypes.memset(p, 1, 2 << 20)\n"
    )
    done = _exec(tmp_path, "--machine", "pool-on-node0", "--", sys.executable, "-c", program)
    assert done.returncode == 135, done.stderr
    assert out.read_bytes() == b""
    assert "no record from the simulated host (the program was ended by SIGBUS)" in done.stderr


def test_calls_on_real_memory_go_to_the_real_kernel(tmp_path: Path) -> None:
    """Memory the C library's allocator gave the program is this box's: a madvise of it is the
    real kernel's (numpy advises its arrays so), the same call on a simulated mapping the
    simulated host's, and one on neither the real kernel's ENOMEM."""
    program = (
        MAP_2MIB_HUGETLB + "real = ctypes.c_void_p()\n"
        "assert libc.posix_memalign(ctypes.byref(real), 4096, 8192) == 0\n"
        "libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]\n"
        "print('real', libc.madvise(real, 8192, 0))\n"  # MADV_NORMAL
        "print('simulated', libc.madvise(p, 2 << 20, 0))\n"
        "print('outside both', libc.madvise(ctypes.c_void_p(4096), 4096, 0), ctypes.get_errno())\n"
    )
    done = _exec(tmp_path, "--json", "r.json", "--", sys.executable, "-c", program)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["real 0", "simulated 0", "outside both -1 12"]  # ENOMEM
    report = json.loads((tmp_path / "r.json").read_text())
    assert [line.split("(")[0] for line in report["trace"] if "madvise" in line] == ["madvise"]


def test_sigterm_to_umbp_sim_ends_the_program(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    sleeper = "import time; print('up', flush=True); time.sleep(300)"
    proc = subprocess.Popen(
        [sys.executable, "-m", "umbp_sim.cli", "exec", "--", sys.executable, "-c", sleeper],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"
        assert len(session_processes(proc.pid)) == 3  # umbp-sim, its keeper and the program
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 143, err
    assert err == "umbp-sim exec: terminated by SIGTERM\n"
    _assert_nothing_left(proc.pid)
    assert list(tmp.iterdir()) == []


def test_ctrl_c_in_a_terminal_goes_to_the_program(tmp_path: Path) -> None:
    """umbp-sim in the foreground of a terminal gives it to the program's group, as a shell
    does: Ctrl-C is the program's (Python dies of SIGINT: 130), a read of the terminal works."""
    master, slave = os.openpty()

    def controlling_terminal() -> None:  # after setsid: the pty is this session's terminal
        import fcntl
        import termios

        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    program = "import time; print('ready', input(), flush=True); time.sleep(300)"
    proc = subprocess.Popen(
        [sys.executable, "-m", "umbp_sim.cli", "exec", "--", sys.executable, "-c", program],
        stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
        preexec_fn=controlling_terminal,
    )  # fmt: skip
    os.close(slave)
    seen = b""
    try:
        os.write(master, b"typed\n")
        deadline = time.monotonic() + 30
        while b"ready typed" not in seen and time.monotonic() < deadline:
            if select.select([master], [], [], 1)[0]:
                seen += os.read(master, 4096)
        assert b"ready typed" in seen
        os.write(master, b"\x03")  # Ctrl-C
        assert proc.wait(timeout=30) == 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(master)
    _assert_nothing_left(proc.pid)


def test_a_program_past_run_timeout_is_ended(tmp_path: Path) -> None:
    sleeper = "import os, time; os.fork(); time.sleep(300)"  # the fork goes with it
    done = _exec(tmp_path, "--run-timeout", "1", "--", sys.executable, "-c", sleeper)
    assert done.returncode == 75, done.stderr
    assert "it ran past --run-timeout 1 s and was ended" in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--machine", "no/such/dump", "--", "true"], "--machine no/such/dump: no such dump"),
        (["--faults", "no-such-plan.toml", "--", "true"], "--faults no-such-plan.toml: no such"),
        (["--faults", "bad.toml", "--", "true"], "--faults bad.toml: faults[0].op: "),
        ([], "CMD: no command given"),
        (["--"], "CMD: no command given"),
        (["--", "./no-such-program"], "CMD ./no-such-program: No such file or directory"),
        (
            ["--json", "no/such/dir/r.json", "--", "true"],
            "--json no/such/dir/r.json: cannot write: No such file or directory",
        ),
    ],
)
def test_bad_input_is_named_and_leaves_nothing(
    tmp_path: Path, args: list[str], message: str
) -> None:
    (tmp_path / "bad.toml").write_text('[[faults]]\nop = "mmapp"\nerrno = "EIO"\n')
    done = _exec(tmp_path, *args)
    assert done.returncode == (73 if "--json" in args else 64), done.stderr
    assert done.stdout == ""
    assert done.stderr.startswith(f"umbp-sim exec: {message}"), done.stderr


@pytest.mark.parametrize(
    ("make", "target", "what"),
    [
        (lambda p: os.mkfifo(p / "r.json"), "r.json", "a FIFO"),
        (lambda p: None, "/dev/full", "a character device"),
        (lambda p: (p / "r.json").symlink_to(p / "gone"), "r.json", "a symbolic link"),
        (lambda p: (p / "r.json").symlink_to(p / "victim"), "r.json", "a symbolic link"),
        (lambda p: (p / "r.json").mkdir(), "r.json", "a directory"),
    ],
    ids=["fifo", "dev-full", "dangling-link", "link", "directory"],
)
def test_a_bad_json_target_is_refused_before_the_run(
    tmp_path: Path, make: Callable[[Path], None], target: str, what: str
) -> None:
    """As collect -o: anything but a regular file (or a new one) is refused in one line before
    the program runs; a link's target is never written through."""
    (tmp_path / "victim").write_text("keep\n")
    make(tmp_path)
    done = _exec(tmp_path, "--json", target, "--", "sh", "-c", "touch ran", timeout=20)
    assert (done.returncode, done.stdout) == (73, "")
    assert done.stderr == f"umbp-sim exec: --json {target}: {what}, not a regular file: refused\n"
    assert not (tmp_path / "ran").exists()
    assert (tmp_path / "victim").read_text() == "keep\n"


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ("add", "sim_config.no_such_field: unknown key"),
        ("drop", "sim_config.root: missing"),
        ("type", "sim_config.page_size: expected an unsigned integer"),
    ],
)
def test_the_host_file_is_checked_key_by_key(
    probe: str, tmp_path: Path, change: str, why: str
) -> None:
    """libumbp_sim_exec.so reads every SimConfig field by name: an unknown, missing or mistyped
    one is an error naming it, and the program does not run on the real host (exit 70)."""
    from umbp_sim.capi import interposer_path
    from umbp_sim.comparison.matrix import machine
    from umbp_sim.exec_host.machine_dir import host_document

    doc = host_document(machine("ample"), None)
    cfg = doc["sim_config"]
    if change == "add":
        cfg["no_such_field"] = 1
    elif change == "drop":
        del cfg["root"]
    else:
        cfg["page_size"] = "4096"
    (tmp_path / "root").mkdir()
    (tmp_path / "host.json").write_text(json.dumps(doc))
    env = {**os.environ, "LD_PRELOAD": interposer_path(), "UMBP_SIM_EXEC": str(tmp_path)}
    done = subprocess.run([probe], env=env, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (70, "")
    assert done.stderr == (
        f"umbp-sim exec: the simulated host did not start: {tmp_path}/host.json: {why}\n"
    )


def test_a_host_that_does_not_start_is_an_error_frame_and_exit_70(
    probe: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through umbp-sim: the program's error frame becomes HostDidNotStart (exit 70) naming
    why, and the private directory is removed."""
    from umbp_sim.capi import interposer_path
    from umbp_sim.comparison.matrix import machine
    from umbp_sim.exec_host import machine_dir as exec_host
    from umbp_sim.exec_host.program_run import HostDidNotStart, run_program

    real = exec_host.host_document

    def broken(*args: object) -> dict[str, object]:
        doc = real(*args)  # type: ignore[arg-type]
        doc["trace_limit"] = -1
        return doc

    monkeypatch.setattr(exec_host, "host_document", broken)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(HostDidNotStart) as e:
        run_program([probe], machine("ample"), "named machine ample", None, 60, interposer_path())
    assert e.value.exit_code == 70
    assert str(e.value).startswith("the simulated host did not start: ")
    assert str(e.value).endswith("host.json: host.trace_limit: expected an unsigned integer")
    assert list(tmp_path.iterdir()) == []


def test_the_evidence_events_of_a_program() -> None:
    """The frames a program under exec writes, decoded as data: an exit (the interposer's
    counters, SimKernel's reasons and trace), a host that did not start; one not of the
    interposer's ends the reading."""
    from umbp_sim.external.evidence import EvidenceReader, ProgramExit, SetupError
    from umbp_sim.external.procs import frame

    kernel = {"crash": None, "reasons": [], "trace": ["mmap(...) = 0x7f0000000000"]}
    stats = {"routed": 3, "faults": 1, "moved": 0, "sim_fds": 0}
    reader = EvidenceReader()
    for doc in (
        {"event": "exit", "pid": 7, "stats": stats, "kernel": kernel},
        {"event": "error", "pid": 8, "text": "the simulated host did not start: why"},
    ):
        reader.feed(frame(json.dumps(doc).encode()))
    assert reader.exits == [
        ProgramExit(pid=7, counts=reader.exits[0].counts, reasons=(), trace=tuple(kernel["trace"]))
    ]
    assert reader.exits[0].counts.routed == 3 and reader.exits[0].counts.faults == 1
    assert reader.errors == [SetupError(pid=8, text="the simulated host did not start: why")]
    reader.feed(frame(b'{"event": "exit", "pid": 9}'))  # no stats: not the interposer's
    reader.feed(frame(json.dumps({"event": "error", "pid": 10, "text": "x"}).encode()))
    assert [e.pid for e in reader.exits] == [7] and [e.pid for e in reader.errors] == [8]
