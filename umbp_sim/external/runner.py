"""An external allocator's server: ``ExternalRunner(spec)``, whose ``observe(run)`` performs an
engine ``Run`` (``umbp_sim.engine``) in a forked child and answers with what it saw.

An external allocator lives in a server process
(``umbp_sim.external.child``) that forks once per run: each run is a fresh process, as in the
field, and its death by a real signal is reported, not suffered. Every wait here is bounded
(``run_timeout``, ``--run-timeout``): the allocator's import, each run (the server ends a run past
it and reports the stage it was in), and the server itself (a server that does not answer within
the limit and ``SERVER_GRACE`` is killed with its process group and started again for the next
run). The processes and their groups: ``umbp_sim.external.procs``.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from typing import Any

from umbp_sim.allocator_spec import AllocatorSpec
from umbp_sim.engine.record import CouldNotRun as CouldNotRun, NoRoom as NoRoom, RunTimedOut
from umbp_sim.external.procs import (
    FrameError,
    FrameReader,
    dumps,
    frame,
    kill_group,
    loads,
    pidfd,
    wait_readable,
    write_within,
)
from umbp_sim.vocabulary.child_python import module_argv

DEFAULT_RUN_TIMEOUT = 60.0  # seconds a run (or the allocator's import) may take
SERVER_GRACE = 60.0  # beyond a run's limit: the server's own work (torch's import for sglang)
CLOSE_GRACE = 5.0  # seconds an idle server gets to exit once its pipe is closed

# The allocator's own heap (glibc's malloc) on transparent hugepages where the host allows them
# (THP "madvise" or "always"; glibc 2.35 and newer read it, older ones ignore it). mori zeroes a
# 256 MiB nodemask for numa_node 2^31-1: 65,536 real page faults on 4 KiB pages, 128 on 2 MiB
# ones (a run 154 -> 36 ms). What the allocator asks of the simulated host is unchanged:
# glibc's malloc maps with its internal mmap, which the interposer does not see.
MALLOC_THP = "glibc.malloc.hugetlb=1"


def with_malloc_thp(env: dict[str, str]) -> dict[str, str]:
    """``env`` with MALLOC_THP added to GLIBC_TUNABLES, unless it sets that tunable already."""
    tunables = env.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb=" not in tunables:
        env["GLIBC_TUNABLES"] = f"{tunables}:{MALLOC_THP}" if tunables else MALLOC_THP
    return env


def seconds(t: float) -> str:
    return f"{t:g} s"


SERVER_START_GRACE = 60.0  # seconds: umbp-sim's own start-up of an allocator server


def no_room_text(reply: dict[str, Any]) -> str | None:
    """The "could not run: ..." line when the run died of a real SIGSEGV or SIGBUS (not
    SimKernel's) while its buffer had no real address space (``run_job.no_room``), else None."""
    room = (reply.get("partial") or {}).get("no_room")
    if room is None or reply.get("signal") not in (signal.SIGSEGV, signal.SIGBUS):
        return None
    if reply.get("evidence") is not None:
        return None  # a simulated death: the verdict
    from umbp_sim.vocabulary.units import format_size

    stage = reply["stages"][-1] if reply["stages"] else "alloc"
    who = "the run writes to" if stage == "write" else "the allocator touches by hand"
    size = format_size(room["size"])
    if room["limit"] == resource.RLIM_INFINITY:  # its memory, vm.max_map_count
        return (
            f"could not run: umbp-sim's process has no real address space left for the {size} "
            f"buffer {who}"
        )
    return (
        f"could not run: this process's RLIMIT_AS (ulimit -v {format_size(room['limit'])}) "
        f"leaves no real address space for the {size} buffer {who}; run umbp-sim without "
        "ulimit -v"
    )


class ExternalRunner:
    """An allocator build in a server process under the interposer; one fork per run."""

    def __init__(
        self,
        spec: AllocatorSpec,
        env: dict[str, str] | None = None,
        run_timeout: float = DEFAULT_RUN_TIMEOUT,
        fork_ahead: bool = True,
    ) -> None:
        self.spec = spec
        self.env = dict(env or {})
        self.run_timeout = run_timeout
        # False: each run's process is forked when its run arrives (the benchmark's baseline)
        self.fork_ahead = fork_ahead
        self.proc: subprocess.Popen[bytes] | None = None
        self._busy = False
        self._start()

    # ---- the server process ----

    def _start(self) -> None:
        spec = self.spec
        to_server, self._to = os.pipe()
        self._from, from_server = os.pipe()
        payload = {
            "kind": spec.kind, "name": spec.name, "path": spec.path or "",
            "module": spec.import_name, "directory": spec.directory or "",
            "fds": [to_server, from_server], "owner": os.getpid(), "timeout": self.run_timeout,
            "fork_ahead": self.fork_ahead,
        }  # fmt: skip
        from umbp_sim.external.exec_program import leave_exec

        child_env = with_malloc_thp(leave_exec({**os.environ, **self.env}))
        # Its stdout and stderr (the allocator's import) go to a file: a pipe nobody reads
        # could fill up and stop it. Its stdin is /dev/null. The protocol has its own fds.
        self._stderr = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen(
                module_argv("umbp_sim.external.child", _json(payload)),
                stdin=subprocess.DEVNULL,
                stdout=self._stderr,
                stderr=self._stderr,
                env=child_env,
                pass_fds=(to_server, from_server),
                **_own_group(),
            )
        except BaseException:
            os.close(self._to)
            os.close(self._from)
            self._stderr.close()
            raise
        finally:
            os.close(to_server)
            os.close(from_server)
        os.set_blocking(self._to, False)
        self._reader = FrameReader()
        self._pending: deque[Any] = deque()
        self._watch = pidfd(self.proc.pid)
        stage = "start"
        try:
            while True:
                # The limit bounds the allocator's own code (its import); umbp-sim's start-up
                # around it (Python, the interposer, the simulated kernel: seconds on a loaded
                # box or under a sanitizer) gets at least SERVER_START_GRACE.
                own = stage != "import"
                hello = self._recv(max(self.run_timeout, SERVER_START_GRACE) if own else
                                   self.run_timeout)  # fmt: skip
                problem = _hello_problem(hello)
                if problem is not None:
                    raise NotOurs(f"{CARRIED} {NOT_OURS}: {problem}")
                if "stage" not in hello:
                    break
                stage = hello["stage"]  # each stage of its start gets the whole limit
        except TimeoutError:
            self.kill()
            raise RunTimedOut(
                f"{spec}: timed out after {seconds(self.run_timeout)} in {stage} (--run-timeout)"
            ) from None
        except EOFError as e:
            # what it said, read before kill() closes its log
            why = (
                str(e) or f"the allocator's process exited before it was ready ({self._last_err()})"
            )
            self.kill()
            raise CouldNotRun(f"{spec}: {why}") from None
        if "error" in hello:
            self.close()
            raise CouldNotRun(f"{spec}: {hello['error']}")
        self.mode: str = hello["mode"]
        self.objects: list[str] = hello["objects"]
        self.registry: bool = hello["registry"]  # acquire/lookup/release steps can run

    def _last_err(self) -> str:
        self._stderr.seek(0)
        err = self._stderr.read().decode(errors="replace").strip()
        return err.splitlines()[-1] if err else "no output"

    def _alive(self) -> bool:
        assert self.proc is not None
        if self._watch is not None:
            return not wait_readable([self._watch], 0)
        return os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None

    def _recv(self, timeout: float) -> Any:
        """The server's next message; TimeoutError past ``timeout`` seconds, EOFError when it
        died (its pipe may stay open: a fork of the allocator can hold it)."""
        deadline = time.monotonic() + timeout
        while not self._pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            fds = [self._from] + ([self._watch] if self._watch is not None else [])
            ready = wait_readable(fds, min(left, 0.25))
            if self._from in ready:
                data = os.read(self._from, 1 << 16)
                if not data:
                    raise EOFError
                try:
                    for f in self._reader.feed(data):
                        self._pending.append(loads(f))
                except FrameError as e:  # the server writes nothing else: not ours
                    raise NotOurs(f"{CARRIED} {e}") from None
            elif not self._alive() and not wait_readable([self._from], 0):
                raise EOFError
        return self._pending.popleft()

    def _send(self, message: Any, timeout: float) -> None:
        data = frame(dumps(message))
        write_within(self._to, data, time.monotonic() + timeout, self._alive)

    # ---- runs ----

    def observe(self, run: Any) -> dict[str, Any]:
        """An engine ``Run`` in a forked child: the server's raw reply
        (``umbp_sim.external.observe.record_from_reply`` reads it)."""
        return self.exchange(run)

    def exchange(self, message: Any) -> dict[str, Any]:
        if self.proc is None:
            self._start()  # the last one did not answer in time and was killed
        limit = self.run_timeout + SERVER_GRACE
        self._busy = True  # until the reply: an interrupted exchange leaves the server busy
        try:
            self._send(message, limit)
            reply: dict[str, Any] = self._recv(limit)
            problem = _reply_problem(reply)
            if problem is not None:
                raise NotOurs(f"{CARRIED} {NOT_OURS}: {problem}")
        except TimeoutError:  # an OSError too: before that branch
            self.kill()  # with its group and its run's (the keeper's part)
            return {
                "result": None, "failed": None, "stages": ["the allocator's server"],
                "partial": {}, "signal": None, "evidence": None, "code": None, "log": "",
                "timed_out": limit, "stopped": None,
            }  # fmt: skip
        except NotOurs as e:  # written by the allocator's code: the server is not to be trusted
            self.kill()
            raise CouldNotRun(f"{self.spec}: the allocator's server was ended: {e}") from None
        except (EOFError, OSError) as e:
            self.kill()
            why = str(e) or "it exited"
            raise CouldNotRun(f"{self.spec}: the allocator's server died ({why})") from None
        self._busy = False
        return reply

    # ---- the end ----

    def close(self) -> None:
        """End the server: told by its pipe when idle (it exits), killed with its process group
        when busy or past ``CLOSE_GRACE``; either way its group is killed before it is reaped."""
        if self.proc is None:
            return
        self._close_fd("_to")
        if not self._busy:
            deadline = time.monotonic() + CLOSE_GRACE
            while self._alive() and time.monotonic() < deadline:
                if self._watch is not None:
                    wait_readable([self._watch], deadline - time.monotonic())
                else:
                    time.sleep(0.01)
        self._end()

    def kill(self) -> None:
        """End the server and its process group now."""
        if self.proc is None:
            return
        self._close_fd("_to")
        self._end()

    def _end(self) -> None:
        # Safe to enter again (a second signal during the first's cleanup): each fd is closed
        # once, and the server is forgotten whatever happens on the way.
        self._busy = False
        proc, self.proc = self.proc, None
        try:
            if proc is not None:
                kill_group(proc.pid)  # not reaped yet: the group id is still the server's
                proc.wait()
        finally:
            self._close_fd("_from")
            self._close_fd("_watch")
            self._stderr.close()

    def _close_fd(self, name: str) -> None:
        fd = getattr(self, name, None)
        setattr(self, name, None)
        if fd is not None and fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass


NOT_OURS = "a message that is not umbp-sim's"
CARRIED = "its channel to umbp-sim carried"


class NotOurs(EOFError):
    """The server's channel carried what no umbp-sim process writes (allocator code wrote it):
    the text says what, after "its channel to umbp-sim carried"."""


def _hello_problem(hello: Any) -> str | None:
    """What is wrong with a message of the server's start (None: it is one), so that a well-formed
    frame of the wrong shape is one line, not a traceback."""
    if not isinstance(hello, dict):
        return f"a {type(hello).__name__} where a stage or the ready message was due"
    if "stage" in hello:
        return None if type(hello["stage"]) is str else "a stage that is not a string"
    if "error" in hello:
        return None if type(hello["error"]) is str else "an error that is not a string"
    if hello.get("ready") is not True:
        return "neither a stage, an error nor the ready message"
    if type(hello.get("mode")) is not str or type(hello.get("registry")) is not bool:
        return "a ready message without its mode or registry"
    objects = hello.get("objects")
    if type(objects) is not list or any(type(p) is not str for p in objects):
        return "a ready message whose objects are not a list of paths"
    return None


# A run's reply (child.Forker.run): each key and the types its value may have.
_REPLY = {
    "result": (dict, type(None)), "failed": (str, type(None)), "stages": (list,),
    "partial": (dict,), "signal": (int, type(None)), "evidence": (object,),
    "code": (int, type(None)), "log": (str,), "timed_out": (int, float, type(None)),
    "stopped": (str, type(None)),
}  # fmt: skip


def _reply_problem(reply: Any) -> str | None:
    """What is wrong with a run's reply (None: it has the shape ``record_from_reply`` reads)."""
    from umbp_sim.engine.record import RunRecord
    from umbp_sim.external.evidence import Death

    if not isinstance(reply, dict):
        return f"a {type(reply).__name__} where a run's reply was due"
    for key, kinds in _REPLY.items():
        if key not in reply:
            return f"a run's reply without {key!r}"
        if not isinstance(reply[key], kinds) or type(reply[key]) is bool:
            return f"a run's reply whose {key!r} is a {type(reply[key]).__name__}"
    if any(type(s) is not str for s in reply["stages"]):
        return "a run's reply whose stages are not strings"
    if reply["evidence"] is not None and not isinstance(reply["evidence"], Death):
        return "a run's reply whose evidence is not a simulated death"
    result = reply["result"]
    if result is not None:
        record = result.get("record")
        if not isinstance(record, RunRecord):
            return "a run's reply whose result holds no run record"
        for f in dataclasses.fields(RunRecord):
            value = getattr(record, f.name, None)
            if not _of_type(value, str(f.type)):
                return f"a run record whose {f.name} is a {type(value).__name__}"
    room, budget = reply["partial"].get("no_room"), reply["partial"].get("budget")
    if room is not None and not (isinstance(room, dict) and _of_type(room.get("size"), "int")
                                 and _of_type(room.get("limit"), "int")):  # fmt: skip
        return "a run's reply whose no_room is not a size and a limit"
    if budget is not None and not isinstance(budget, dict):
        return "a run's reply whose budget is not a table"
    return None


_TYPES = {"str": str, "int": int, "bool": bool, "list": list, "dict": dict}


def _of_type(value: Any, annotation: str) -> bool:
    """Whether ``value`` fits a field's annotation as written ("str | None", "list[str]",
    "Any"): its outer type only, an int not being a bool."""
    for part in annotation.split(" | "):
        name = part.split("[")[0].strip()
        if name == "Any" or (name == "None" and value is None):
            return True
        kind = _TYPES.get(name)
        if kind is None:
            return True  # a type this check does not know: the annotation's own business
        if type(value) is kind or (kind is not bool and isinstance(value, kind)
                                   and not isinstance(value, bool)):  # fmt: skip
            return True
    return False


def _json(payload: dict[str, Any]) -> str:
    import json

    return json.dumps(payload)


def _own_group() -> dict[str, Any]:
    """Popen's arguments that start the child as the leader of a new process group."""
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"preexec_fn": os.setpgrp}  # pragma: no cover - Python 3.10


def failure_text(reply: dict[str, Any]) -> str:
    """Why a run's process ended with no result: the exception it reported, else (the allocator
    exited by itself) the last line of its log or its exit code."""
    if reply.get("failed"):
        return str(reply["failed"])
    log = reply["log"].strip()
    return log.splitlines()[-1] if log else f"exit code {reply['code']}"


def timed_out_text(reply: dict[str, Any]) -> str:
    """The text of a run past its limit: "timed out after 60 s in alloc" (the last stage)."""
    stage = reply["stages"][-1] if reply["stages"] else "start"
    return f"timed out after {seconds(reply['timed_out'])} in {stage}"
