"""The compiler as build-allocator runs it: a bounded process umbp-sim owns.

Each compiler command (the build, the preprocessing of spdlog's header) runs in a process
group of its own, with

- stdin ``/dev/null`` (``#include "/dev/stdin"`` reads nothing),
- ``--build-timeout`` seconds of wall time for the whole group (a FIFO or a device included, a
  compiler that never ends: the group is ended, one line names the stage and the flag), and as
  much CPU time per process (``RLIMIT_CPU``),
- ``--build-memory`` bytes of address space per process (``RLIMIT_AS``: ``#include
  "/dev/zero"`` runs out of memory there, not in the machine's),
- ``MAX_FILE_SIZE`` bytes per file it writes (``RLIMIT_FSIZE``),
- its output (stdout and stderr, one pipe) kept to its head and tail (``run_log.RunLog``),

and it ends with umbp-sim however umbp-sim ends: ``finally`` on an error, Ctrl-C, SIGTERM or
SIGHUP (``procs.ended_by_signals``), and, for SIGKILL, the keeper (``procs.start_keeper``), which
ends the group and removes the build's temporary directory when umbp-sim's process dies.
"""

from __future__ import annotations

import math
import os
import resource
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass

from umbp_sim.external import procs
from umbp_sim.external.run_log import RunLog

DEFAULT_TIMEOUT = 600.0  # seconds: a mori build takes a minute on 2 cores
DEFAULT_MEMORY = 4 << 30  # bytes of address space per compiler process
MAX_FILE_SIZE = 1 << 30  # bytes per file a compiler process writes (the .so is a few MiB)
OUTPUT_LIMIT = 256 << 10  # bytes of the compiler's output kept (head and tail)
# A compiler whose largest process came this close to --build-memory is said to have hit it.
NEAR_LIMIT = 0.5


@dataclass(frozen=True)
class BuildLimits:
    """What each compiler command may take: ``--build-timeout``, ``--build-memory``."""

    timeout: float = DEFAULT_TIMEOUT
    memory: int = DEFAULT_MEMORY
    file_size: int = MAX_FILE_SIZE


@dataclass(frozen=True)
class Compiled:
    """A compiler command that ended: its exit status (``-N``: killed by signal N), its output
    (head and tail), the peak resident set of its largest process, in bytes."""

    returncode: int
    output: str
    peak_rss: int

    def near_memory_limit(self, limits: BuildLimits) -> bool:
        return self.peak_rss >= NEAR_LIMIT * limits.memory


class CompilerTimeout(Exception):
    """The compiler's group did not end within ``--build-timeout`` (it has been ended)."""


def _limit_child(limits: BuildLimits, parent: int) -> None:
    """In the compiler's process, before exec: its own group, death with umbp-sim, the limits."""
    os.setpgid(0, 0)
    procs.die_with_parent(parent)
    cpu = max(1, math.ceil(limits.timeout))
    _lower(resource.RLIMIT_CPU, cpu, cpu + 5)  # SIGXCPU, then SIGKILL
    _lower(resource.RLIMIT_AS, limits.memory, limits.memory)
    _lower(resource.RLIMIT_FSIZE, limits.file_size, limits.file_size)
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it; the compiler must not


def _lower(which: int, soft: int, hard: int) -> None:
    """Limit ``which`` to (soft, hard), never above the limits umbp-sim itself runs under (an
    analyst's ``ulimit -v``: raising a hard limit would fail the exec)."""
    old_soft, old_hard = resource.getrlimit(which)
    if old_hard != resource.RLIM_INFINITY:
        hard = min(hard, old_hard)
        soft = min(soft, hard)
    if old_soft != resource.RLIM_INFINITY:
        soft = min(soft, old_soft)
    resource.setrlimit(which, (soft, hard))


def run_compiler(
    cmd: Sequence[str],
    env: dict[str, str],
    limits: BuildLimits,
    remove: str | None = None,
) -> Compiled:
    """Run ``cmd`` bounded as the module says; CompilerTimeout past ``limits.timeout``.
    ``remove``: a directory the keeper deletes should umbp-sim be killed meanwhile."""
    deadline = time.monotonic() + limits.timeout
    keeper, keeper_fd = procs.start_keeper(os.getpid(), server_group=False, remove=remove)
    log = RunLog(OUTPUT_LIMIT)
    proc: subprocess.Popen[bytes] | None = None
    parent = os.getpid()
    try:
        proc = subprocess.Popen(
            list(cmd), stdin=subprocess.DEVNULL, stdout=log.wfd, stderr=log.wfd, env=env,
            preexec_fn=lambda: _limit_child(limits, parent),
        )  # fmt: skip
        procs.tell_keeper(keeper_fd, proc.pid)
        os.close(log.wfd)
        log.wfd = -1
        status = _wait(proc, log, deadline)
        if status is None:
            raise CompilerTimeout
        code, rusage = status
        return Compiled(code, log.text(), rusage.ru_maxrss * 1024)
    finally:
        if proc is not None:
            procs.kill_group(proc.pid)  # what it left behind in its group
            if proc.returncode is None:
                _reap(proc)
        procs.tell_keeper(keeper_fd, procs.QUIT)
        os.close(keeper_fd)
        os.waitpid(keeper, 0)
        log.close()


def _wait(
    proc: subprocess.Popen[bytes], log: RunLog, deadline: float
) -> tuple[int, resource.struct_rusage] | None:
    """The compiler's exit status and resource usage (its own and its descendants'), read
    until its output ends and it exits; None at the deadline."""
    open_pipe = True
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        if open_pipe:
            if procs.wait_readable([log.rfd], min(left, 0.05)):
                data = os.read(log.rfd, 1 << 16)
                log.feed(data)
                open_pipe = bool(data)
        else:  # a process it left holds no pipe of ours: its exit is all there is to wait for
            time.sleep(min(left, 0.02))
        pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            if open_pipe:
                log.drain(OUTPUT_LIMIT)  # what it wrote last; not what its leftovers go on with
            return proc.returncode, rusage


def _reap(proc: subprocess.Popen[bytes]) -> None:
    """Wait for the (killed) compiler's process: a moment, SIGKILL having been sent."""
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL ends a process
        pass
