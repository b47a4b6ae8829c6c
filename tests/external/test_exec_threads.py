"""``umbp-sim exec`` of multi-threaded programs (issue 43 point 1): threads mapping, touching
and unmapping at once, on each fault path, end as they would on the real kernel.

A page fault's resolver (the SIGSEGV handler, or the userfaultfd thread) holds the interposer's
mapping table while it asks the simulated host; the host, inside another thread's mmap or
munmap, makes real munmap calls that come back through the interposer. When those waited for
the table, two threads were enough for a deadlock that only ``--run-timeout`` ended (exit 75):
exec_threads.c's 8 threads x 300 iterations, C or Python through ctypes, hung in nearly every
run. The lock order is written in csrc/interposer/interposer_internal.h.

Evidence is the program's exit status and exec's ``--json`` report: the calls the simulated
host answered and the page faults it handled, counted by the interposer in the program. Marked
``threads``: ``tox -e tsan`` runs them with the TSan-built interposer in the program, where any
report (a race, a lock-order inversion) fails the run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from build_cache import cached_build

from umbp_sim.toolchain.wrapped_build import include_dirs

from .test_exec import _exec

HERE = Path(__file__).resolve().parent

THREADS = 8
ITERATIONS = 300
# Each iteration's calls the simulated host answers: mmap + munmap, or for a memfd
# memfd_create + ftruncate + mmap + close + munmap; and one page fault (the one byte written).
CALLS_PER_ITERATION = {"hugetlb": 2, "anon": 2, "memfd": 5}
# A run takes about a second here; the old deadlock was only ended by this limit.
RUN_TIMEOUT = 30

pytestmark = pytest.mark.threads


@pytest.fixture(scope="session")
def exec_threads(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = str(tmp_path_factory.mktemp("exec_threads") / "exec_threads")
    cmd = ["cc", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O1", "-pthread"]
    cmd += [f"-I{include_dirs()[0]}", str(HERE / "exec_threads.c"), "-o", out, "-ldl"]
    return cached_build(cmd, out)


def _assert_ran_every_call(
    tmp_path: Path, done: subprocess.CompletedProcess[str], calls: int, faults: int
) -> None:
    """The program exited 0 having made every call: ``calls`` answered by the simulated host,
    ``faults`` page faults, none refused, no time limit, no signal."""
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["exit_status"] == 0
    assert (report["timed_out"], report["ended_by"], report["death"]) == (None, None, None)
    assert (report["simulated_calls"], report["page_faults"]) == (calls, faults)
    assert [r for r in report["reasons"] if r["errno"] or r["signal"]] == []
    assert report["other_processes"] == []


@pytest.mark.parametrize("kind", sorted(CALLS_PER_ITERATION))
@pytest.mark.parametrize("fault_path", ["uffd", "sigsegv"])
def test_threads_map_touch_and_unmap_at_once(
    exec_threads: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fault_path: str,
    kind: str,
) -> None:
    monkeypatch.setenv("UMBP_SIM_FAULT_PATH", fault_path)
    args = [exec_threads, kind, str(THREADS), str(ITERATIONS), fault_path]
    done = _exec(
        tmp_path, "--run-timeout", str(RUN_TIMEOUT), "--json", "report.json", "--", *args,
        timeout=RUN_TIMEOUT + 30,
    )  # fmt: skip
    n = THREADS * ITERATIONS
    _assert_ran_every_call(tmp_path, done, n * CALLS_PER_ITERATION[kind], n)


# Python threads through ctypes, as a Python program's extension module calls (the issue's
# second reproducer): THREADS threads each map a 2 MiB MAP_HUGETLB page, write a byte and unmap,
# ITERATIONS times (argv). The calls release the GIL: the threads run at once.
PYTHON_THREADS = """
import ctypes, sys, threading
threads, iterations = int(sys.argv[1]), int(sys.argv[2])
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t] + [ctypes.c_int] * 3 + [ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
failed = []
def work():
    for i in range(iterations):
        p = libc.mmap(None, 2 << 20, 3, 0x22 | 0x40000 | (21 << 26), -1, 0)
        if p in (None, ctypes.c_void_p(-1).value):
            failed.append(("mmap", ctypes.get_errno()))
            return
        ctypes.memset(p + (i % 512) * 4096, 1, 1)
        if libc.munmap(p, 2 << 20) != 0:
            failed.append(("munmap", ctypes.get_errno()))
            return
workers = [threading.Thread(target=work) for _ in range(threads)]
for t in workers:
    t.start()
for t in workers:
    t.join()
sys.exit(str(failed) if failed else 0)
"""


@pytest.mark.parametrize("fault_path", ["uffd", "sigsegv"])
def test_python_threads_through_ctypes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault_path: str
) -> None:
    monkeypatch.setenv("UMBP_SIM_FAULT_PATH", fault_path)
    program = [sys.executable, "-c", PYTHON_THREADS, str(THREADS), str(ITERATIONS)]
    done = _exec(
        tmp_path, "--run-timeout", str(RUN_TIMEOUT), "--json", "report.json", "--", *program,
        timeout=RUN_TIMEOUT + 30,
    )  # fmt: skip
    n = THREADS * ITERATIONS
    _assert_ran_every_call(tmp_path, done, 2 * n, n)
