"""The process that hosts an external allocator: ``python -m umbp_sim.external.child SPEC``.

It imports the allocator once (a module with mori's Python API, or an extension module at a
path), then serves runs: each engine ``Run`` read from its owner is performed by a forked
child (``Forker``), a fresh process as far as the allocator's once-flags and registries are
concerned (``umbp_sim.external.run_job``: the simulated host, the interposer active on it, the
allocator called). The child is forked ahead, while the run before it runs, and warms up (what
a run writes of the server's memory, copied before its run arrives); it waits in the server's
group and is given its run, a group of its own and the keeper's watch. Its stdout and stderr
(the allocator's log) go to a pipe the server reads, keeping head and tail
(``umbp_sim.external.run_log``), its stages to memory it shares with the server
(``procs.StageBoard``), its result (or the exception that ended it) to a pipe, and the
interposer's evidence of a simulated death to a second pipe (``umbp_sim.external.evidence``).
The server waits for it, at most the run's time limit (``--run-timeout``), and answers with what
it saw: the result as soon as it is sent (the child then exits; it is reaped after), else the
exit status (a real SIGBUS is data) and the evidence, a stop (SIGSTOP: ended at once), or the
time limit and the last stage the child posted ("alloc", "free", ...), the run's process group
then killed. Nothing umbp-sim reads comes from the log: it is the allocator's text, and only its
warnings are taken from it.

Protocol: on two private pipe fds passed at start (SPEC's ``fds``), never on stdin/stdout: the
server's stdin is /dev/null and its stdout goes to its stderr (a file its owner reads when it
fails), so what the allocator prints or reads can neither carry nor corrupt a message. Each
message is a 4-byte big-endian length + a JSON document of plain data
(``umbp_sim.external.wire``: decoded within bounds, nothing it names is called). The server
says ``{"stage": ...}`` as it starts ("import": the allocator's import, "setup"), then
``{"ready": True, "mode": ..., "objects": [...], "registry": ...}`` (whether the build has the
shm registry's functions) or ``{"error": "..."}``; umbp-sim checks each message's shape
(``runner``: anything else is one line). The processes: ``umbp_sim.external.procs``.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.machinery
import importlib.util
import json
import os
import re
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from typing import Any

from umbp_sim.external.evidence import EvidenceReader
from umbp_sim.external.procs import (
    MAX_FRAME,
    QUIT,
    FrameError,
    FrameReader,
    StageBoard,
    die_with_parent,
    dumps,
    frame,
    kill_group,
    loads,
    pidfd,
    raise_address_space_limit,
    signal_name,
    start_keeper,
    tell_keeper,
    wait_readable,
    write_all,
    write_within,
)
from umbp_sim.external.run_log import RunLog
from umbp_sim.vocabulary.child_python import module_argv

_SYSTEM_LIB = re.compile(
    r"/(ld-linux[^/]*|libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|libpython[^/]*|"
    r"libz|libffi|libutil|libcrypt)[.-][^/]*$"
)


def send(fd: int, obj: Any) -> None:
    write_all(fd, frame(dumps(obj)))


def _read_exact(fd: int, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        data = os.read(fd, n - len(out))
        if not data:
            raise EOFError
        out += data
    return bytes(out)


def recv_payload(fd: int) -> bytes:
    """The next frame's payload on ``fd`` (blocking: the server's read of its owner's next job)."""
    n = int.from_bytes(_read_exact(fd, 4), "big")
    if n > MAX_FRAME:
        raise FrameError(f"a frame of {n:,} bytes (at most {MAX_FRAME:,})")
    return _read_exact(fd, n)


def recv(fd: int) -> Any:
    """The next message on ``fd`` (blocking)."""
    return loads(recv_payload(fd))


def loaded_objects() -> list[str]:
    """Paths of the shared objects mapped in this process, in first-seen order."""
    seen: dict[str, None] = {}
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and ".so" in parts[5]:
                seen.setdefault(parts[5].strip(), None)
    return list(seen)


def load_allocator(spec: dict[str, str]) -> Any:
    """The module holding UMBPHostMemAllocator / UMBPHostBufferBacking."""
    if spec["kind"] == "module":
        if spec.get("directory"):  # first, as `python -m` has the working directory
            sys.path.insert(0, spec["directory"])
        return importlib.import_module(spec.get("module") or spec["name"])
    path = spec["path"]
    base = os.path.basename(path).split(".")[0]
    names = [base] + ([base[3:]] if base.startswith("lib") else [])
    last: Exception | None = None
    for name in names:
        loader = importlib.machinery.ExtensionFileLoader(name, path)
        mod_spec = importlib.util.spec_from_loader(name, loader)
        assert mod_spec is not None
        try:
            module = importlib.util.module_from_spec(mod_spec)
            loader.exec_module(module)
            return module
        except ImportError as e:
            last = e
    raise ImportError(f"{path}: not a Python extension module with mori's API ({last})")


def allocator_objects(before: list[str], after: list[str], interposer: str) -> list[str]:
    """The objects the allocator's import brought in, without system libraries."""
    old = set(before)
    real_interposer = os.path.realpath(interposer)
    return [
        p
        for p in after
        if p not in old and not _SYSTEM_LIB.search(p) and os.path.realpath(p) != real_interposer
    ]


def serve(spec: dict[str, Any]) -> int:
    from umbp_sim.capi import interposer_path
    from umbp_sim.external.interposer import Interposer

    inp, out = spec["fds"]
    keeper_fd = spec.get("keeper_fd")
    interposer = interposer_path()
    before = loaded_objects()
    send(out, {"stage": "import"})
    try:
        module = load_allocator(spec)
        for attr in ("UMBPHostMemAllocator", "UMBPHostBufferBacking"):
            if not hasattr(module, attr):
                raise ImportError(f"{spec.get('name') or spec.get('path')}: no {attr}")
    except BaseException as e:  # noqa: BLE001 - reported to the parent as one line
        send(out, {"error": _one_line(f"{type(e).__name__}: {e}")})
        return 2
    send(out, {"stage": "setup"})
    after = loaded_objects()
    wrapped = any(os.path.realpath(p) == os.path.realpath(interposer) for p in after) and (
        interposer not in os.environ.get("LD_PRELOAD", "")
    )
    preloaded = interposer in os.environ.get("LD_PRELOAD", "")
    if not wrapped and not preloaded:
        # A prebuilt module: start again with the interposer preloaded.
        env = dict(os.environ)
        from umbp_sim.external.exec_program import preload_list

        # After a sanitizer runtime, before what else is preloaded (exec_program says why).
        env["LD_PRELOAD"] = preload_list(env.get("LD_PRELOAD", ""), interposer)
        for fd in (inp, out, keeper_fd):
            if fd is not None:
                os.set_inheritable(fd, True)  # the protocol and the keeper's pipe go along
        argv = module_argv("umbp_sim.external.child", json.dumps(spec))
        os.execve(sys.executable, argv, env)
    ip = Interposer(interposer)
    problem = ip.fault_path_problem()
    if problem:
        send(out, {"error": problem})
        return 2
    # What every run needs, imported once here: a forked child would import it each time.
    import umbp_sim.host.trace  # noqa: F401

    objects = allocator_objects(before, after, interposer)
    if spec["kind"] == "shared-object" and spec["path"] not in objects:
        objects.append(os.path.realpath(spec["path"]))
    for p in objects:
        ip.add_caller_object(p)
    from umbp_sim.external.run_job import has_registry

    send(out, {"ready": True, "mode": "wrap" if wrapped else "preload", "objects": objects,
               "registry": has_registry(module)})  # fmt: skip
    private = tuple(fd for fd in (inp, out, keeper_fd) if fd is not None)
    ahead = bool(spec.get("fork_ahead", True))
    forker = Forker(module, ip, float(spec["timeout"]), keeper_fd, private, ahead)
    try:
        while True:
            try:
                payload = recv_payload(inp)
            except EOFError:
                return 0
            send(out, forker.run(loads(payload), payload))
    finally:
        forker.close()


def _one_line(text: str) -> str:
    return " ".join(text.split())[:500]


@dataclasses.dataclass
class _Child:
    """A run's process, forked before its run is known: it waits on ``job`` (the server's end of
    the pipe its run goes down), in the server's group until it is given one."""

    pid: int
    job: int
    rfd: int  # its progress and result (frames of wire.py's JSON)
    erfd: int  # the interposer's evidence of a simulated death (JSON frames)
    log: RunLog  # its stdout and stderr
    board: StageBoard  # its stages

    def fds(self) -> tuple[int, ...]:
        return tuple(fd for fd in (self.job, self.rfd, self.erfd, self.log.rfd) if fd >= 0)

    def close(self) -> None:
        for fd in (self.job, self.rfd, self.erfd):
            if fd >= 0:
                os.close(fd)
        self.job = self.rfd = self.erfd = -1
        self.log.close()
        self.board.close()


class Forker:
    """The server's runs, each in a forked child (a process group of its own), at most
    ``timeout`` seconds; it collects the child's result, log, stages and exit status. The run's
    group is killed when it ends, so what the allocator forked ends with it. ``private``: the
    server's own fds, closed in a child.

    A run's child is forked ahead (while the run before it runs), so a run waits for no fork:
    the spare sits in the server's group (its owner's kill and the keeper's reach it, and it
    dies with the server) until it is given its run, moved to a group of its own and named to
    the keeper. A spare that lacks what the server has just loaded for a run (torch) is
    discarded. The reply goes out as soon as the child has sent its result (it exits then);
    the child is reaped after. ``ahead`` False: each run's child is forked when the run arrives,
    with no warm-up (the benchmark's baseline).

    A ``Run`` is performed by ``run_job.run_job`` (its result: the run's ``RunRecord``).
    """

    def __init__(
        self,
        module: Any,
        ip: Any,
        timeout: float = 60.0,
        keeper_fd: int | None = None,
        private: tuple[int, ...] = (),
        ahead: bool = True,
    ) -> None:
        self._module, self._ip, self._timeout = module, ip, timeout
        self._keeper_fd, self._private, self._ahead = keeper_fd, private, ahead
        self._spare: _Child | None = None
        self._unreaped: list[int] = []  # children that sent their result and were killed
        self._last: Any = None  # the last run given: a spare warms up on its host

    def run(self, run: Any, payload: bytes | None = None) -> dict[str, Any]:
        """``run`` in a forked child (``payload``: the run as its owner sent it, passed on to
        the child as it is; None: encoded here)."""
        # Loaded once the allocator is (serve: a prebuilt module starts this process again).
        from umbp_sim.external import run_job

        self._reap()
        if run_job.prepare(run) and self._spare is not None:  # the spare was forked before it
            self._discard(self._spare)
            self._spare = None
        child = self._spare or self._fork(())
        self._spare = None
        deadline = time.monotonic() + self._timeout
        try:
            os.setpgid(child.pid, child.pid)  # its own group before it does anything of the run
        except OSError:
            pass  # it died as a spare: the watch sees how
        tell_keeper(self._keeper_fd, child.pid)
        _give(child.job, frame(dumps(run) if payload is None else payload), deadline)
        self._last = run
        os.close(child.job)
        child.job = -1
        if self._ahead:
            self._spare = self._fork(child.fds())  # the next run's, while this one runs
        try:
            seen = _watch_run(child.pid, child.rfd, child.erfd, child.log, deadline)
            _take_board(child.board, seen)
        finally:
            kill_group(child.pid)  # what the allocator forked (the child is not reaped yet)
            tell_keeper(self._keeper_fd, 0)
        child.log.drain()  # what it wrote before its end
        status: int | None = None
        ended = seen["ended"]
        if ended == "result":
            self._unreaped.append(child.pid)  # exiting: reaped once it has
        else:
            _, status = os.waitpid(child.pid, 0)
        text = child.log.text()
        child.close()
        code: int | None
        signum: int | None = None
        if status is None:  # it sent its result and exits as run_job's caller does
            code = 0 if seen["result"] is not None else 70
        else:
            code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
            signum = os.WTERMSIG(status) if os.WIFSIGNALED(status) and not ended else None
        return {
            "result": seen["result"],
            "failed": seen["failed"],
            "stages": seen["stages"],
            "partial": seen["partial"],
            "signal": signum,
            "evidence": seen["evidence"].death,
            "code": code,
            "log": text,
            "timed_out": self._timeout if ended == "timeout" else None,
            "stopped": seen["stopped"],
        }

    def close(self) -> None:
        """The spare killed, every child reaped."""
        if self._spare is not None:
            self._discard(self._spare)
            self._spare = None
        self._reap(block=True)

    def _reap(self, block: bool = False) -> None:
        """Reap the killed children that have exited (all of them when ``block``): a child's
        exit (its address space torn down) takes longer than its run's reply."""
        for pid in list(self._unreaped):
            done, _ = os.waitpid(pid, 0 if block else os.WNOHANG)
            if done:
                self._unreaped.remove(pid)

    def _discard(self, spare: _Child) -> None:
        os.kill(spare.pid, signal.SIGKILL)  # in the server's group: not a group of its own
        os.waitpid(spare.pid, 0)
        spare.close()

    def _fork(self, others: tuple[int, ...]) -> _Child:
        """A child waiting for its run; ``others``: the running child's fds (closed in it)."""
        from umbp_sim.external import run_job

        log = RunLog()
        board = StageBoard()
        jfd, job = os.pipe()  # the run, down to the child
        rfd, wfd = os.pipe()
        erfd, ewfd = os.pipe()
        server = os.getpid()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 0
            try:
                die_with_parent(server)
                for fd in (job, rfd, erfd, log.rfd, *self._private, *others):
                    os.close(fd)
                # Before its log is its stdout: what the warm-up writes is not the allocator's.
                if self._ahead and self._last is not None:
                    run_job.warm_up(self._ip, self._last)
                os.dup2(log.wfd, 1)
                os.dup2(log.wfd, 2)
                os.close(log.wfd)
                self._ip.set_evidence_fd(ewfd)
                try:
                    run = recv(jfd)
                except EOFError:  # a spare discarded, or the server gone
                    os._exit(0)
                os.setpgid(0, 0)  # as the server does: whichever comes first

                def report(stage: str, **extra: Any) -> None:
                    message = {"stage": stage, **extra}
                    if not board.post(dumps(message)):
                        send(wfd, message)

                send(wfd, {"result": run_job.run_job(self._module, self._ip, run, report)})
            except BaseException as e:  # noqa: BLE001
                traceback.print_exc()  # for a person reading the log; umbp-sim reads the frame
                send(wfd, {"failed": _one_line(f"{type(e).__name__}: {e}")})
                code = 70
            finally:
                os._exit(code)
        for fd in (jfd, wfd, ewfd, log.wfd):
            os.close(fd)
        log.wfd = -1
        return _Child(pid, job, rfd, erfd, log, board)


def _give(fd: int, data: bytes, deadline: float) -> None:
    """``data`` down the child's job pipe by ``deadline``; a child that died or stopped taking
    it is the watch's to report."""
    os.set_blocking(fd, False)
    try:
        write_within(fd, data, deadline)
    except (TimeoutError, OSError):  # OSError: EPIPE, it is gone
        pass


def _watch_run(pid: int, rfd: int, erfd: int, log: RunLog, deadline: float) -> dict[str, Any]:
    """Read the child's messages (``rfd``), the interposer's evidence (``erfd``) and its log
    until it sends its result (or the exception that ended it: it exits then), exits, stops or
    runs out of time (``deadline``, monotonic). Not reaped: its pid, the run's group id, stays
    ours until the caller has killed the group (and drained the rest of its log)."""
    reader = FrameReader()
    seen: dict[str, Any] = {
        "stages": [], "partial": {}, "result": None, "failed": None, "ended": None,
        "stopped": None, "evidence": EvidenceReader(),
    }  # fmt: skip
    feeds = {
        rfd: lambda data: _take(reader.feed(data), seen),
        erfd: seen["evidence"].feed,
        log.rfd: log.feed,
    }
    pipes = [rfd, erfd, log.rfd]  # those not at their end yet
    watch = pidfd(pid)
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                seen["ended"] = "timeout"
                break
            # A slice: a stop (SIGSTOP) wakes nothing; nor, without a pidfd, an exit while
            # the allocator's fork holds the pipes open.
            wake = 0.25 if watch is not None or pipes else 0.005
            ready = wait_readable(pipes + ([watch] if watch is not None else []), min(left, wake))
            read = False
            for fd in [fd for fd in pipes if fd in ready]:
                data = os.read(fd, 1 << 16)
                if not data:
                    pipes.remove(fd)
                feeds[fd](data)
                read = read or bool(data)
            if seen["result"] is not None or seen["failed"] is not None:
                seen["ended"] = "result"  # its last message: what it wrote before is read
                break
            if read and watch not in ready:
                continue
            state = os.waitid(os.P_PID, pid, os.WEXITED | os.WSTOPPED | os.WNOHANG | os.WNOWAIT)
            if state is None:
                continue
            if state.si_code == os.CLD_STOPPED:
                seen["ended"] = "stopped"
                seen["stopped"] = signal_name(state.si_status)
                break
            # Exited: what it wrote before is still in the pipes (the log's: the caller's).
            for fd in [fd for fd in pipes if fd != log.rfd]:
                os.set_blocking(fd, False)
                while time.monotonic() < deadline:
                    try:
                        data = os.read(fd, 1 << 16)
                    except BlockingIOError:
                        break
                    if not data:
                        break
                    feeds[fd](data)
            break
    finally:
        if watch is not None:
            os.close(watch)
    return seen


def _take(frames: Iterator[bytes], seen: dict[str, Any]) -> None:
    """The run's messages into ``seen``; what the allocator wrote on the run's pipe (it runs in
    that process) is skipped, and a frame past MAX_FRAME ends the reading of this feed."""
    try:
        for f in frames:
            try:
                msg = loads(f)
            except FrameError:  # not the child's: the allocator wrote on its pipe
                continue
            if not isinstance(msg, dict):
                continue
            if "stage" in msg:
                if type(msg["stage"]) is not str:
                    continue  # not the child's: it names its stages
                seen["stages"].append(msg.pop("stage"))
                seen["partial"].update(msg)
            elif "result" in msg:
                seen["result"] = msg["result"]
            elif "failed" in msg:
                seen["failed"] = str(msg["failed"])
    except FrameError:
        return


def _take_board(board: StageBoard, seen: dict[str, Any]) -> None:
    """The stages the child posted on ``board`` into ``seen``, before those that came by the
    pipe (sent when the board was full)."""
    late_stages, late_partial = seen["stages"], seen["partial"]
    seen["stages"], seen["partial"] = [], {}
    _take(board.frames(), seen)
    seen["stages"] += late_stages
    seen["partial"].update(late_partial)


def main() -> int:
    raise_address_space_limit()  # before the allocator's import: its runs inherit it
    spec = json.loads(sys.argv[1])
    die_with_parent(spec["owner"])  # SIGKILL when the owner (a command, a worker) dies
    if os.getpgrp() != os.getpid():
        os.setpgid(0, 0)
    if "keeper" not in spec:  # the first start (not the start again with the interposer)
        spec["keeper"], spec["keeper_fd"] = start_keeper(os.getpid())
    for fd in (*spec["fds"], spec["keeper_fd"]):
        os.set_inheritable(fd, False)  # a process the allocator starts does not get them
    code = serve(spec)
    # An end as it should be (the owner closed our pipe): the keeper goes first, reaped here;
    # the owner then kills what is left in our group (what the allocator's import forked).
    tell_keeper(spec["keeper_fd"], QUIT)
    try:
        os.waitpid(spec["keeper"], 0)
    except ChildProcessError:
        pass
    return code


if __name__ == "__main__":
    sys.exit(main())
