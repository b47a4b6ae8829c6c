"""The keeper of a program ``umbp-sim exec`` runs: the process that starts it, holds its whole
tree, and ends it however umbp-sim ends (SIGKILL included).

umbp-sim forks the keeper (``ProgramKeeper``); the keeper, in a process group of its own (a kill
of umbp-sim's group leaves it to clean up), makes itself a child subreaper
(``procs.become_subreaper``) and starts the program. So every process the program starts stays
in the keeper's tree, by parent links, whatever group or session it makes for itself (``setsid``
included): an orphan comes back to the keeper, not to init. The keeper tells umbp-sim, as
frames on a pipe (``procs.dumps``: data, never text), the program's pid (or why it did not
start), then its exit status once the program has exited and the keeper has ended the rest of
the tree (``procs.end_tree``). It ends the tree early when umbp-sim says ``end`` (past
``--run-timeout``, or umbp-sim told to end by a signal) and when umbp-sim dies (its control
pipe's end, or its pidfd). Last, once umbp-sim has closed the control pipe (it is done with the
run) or died, the keeper removes the host's private directory and exits: a SIGKILL of umbp-sim
at any moment leaves neither a process nor the directory. The program dies with the keeper
(``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from umbp_sim.errors import UmbpSimError
from umbp_sim.external.procs import (
    TERMINATING_SIGNALS,
    FrameError,
    FrameReader,
    become_subreaper,
    die_with_parent,
    dumps,
    end_tree,
    frame,
    kill_group,
    loads,
    open_fds,
    pidfd,
    wait_readable,
    write_all,
)
from umbp_sim.vocabulary.exit_codes import EX_SOFTWARE

# Seconds the keeper takes at most to end a tree (a process in uninterruptible sleep takes its
# time to die); umbp-sim waits a little longer for it before it kills the keeper itself.
END_WITHIN = 10.0
END = b"end"


class KeeperGone(UmbpSimError):
    """The keeper died or said nothing umbp-sim can read (a bug: exit 70)."""

    exit_code = EX_SOFTWARE


def _returncode(info: Any) -> int:
    """Popen's returncode (-N: a death by signal N) from a waitid() result."""
    if info.si_code == os.CLD_EXITED:
        return int(info.si_status)
    return -int(info.si_status)


class ProgramKeeper:
    """``with ProgramKeeper(command, env, pass_fd, preexec, host_dir) as keeper``: the program
    started by the keeper; ``keeper.pid`` is the program's, ``keeper.status_fd`` is readable
    once ``keeper.returncode()`` has the answer; leaving the block ends the tree."""

    def __init__(
        self,
        command: Sequence[str],
        env: dict[str, str],
        pass_fd: int,
        preexec: Callable[[int], None],
        host_dir: str,
    ) -> None:
        self.pid = 0
        self._closed = False
        self._rc: int | None = None
        self._frames: Iterator[Any] = iter(())
        self._reader = FrameReader()
        status_r, status_w = os.pipe()
        control_r, control_w = os.pipe()
        owner = os.getpid()
        keeper = os.fork()
        if keeper == 0:  # never returns
            try:
                os.close(status_r)
                os.close(control_w)
                _keep(owner, command, env, pass_fd, preexec, host_dir, status_w, control_r)
            finally:
                os._exit(0)
        os.close(status_w)
        os.close(control_r)
        self.keeper = keeper
        self.status_fd = status_r
        self._control = control_w
        try:
            first = self._next(END_WITHIN + 20)
        except BaseException:
            self.close()
            raise
        if "error" in first:
            self.close()
            raise OSError(first["errno"], first["error"])
        self.pid = int(first["pid"])

    def _next(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for payload in self._frames:
                msg = loads(payload)
                if isinstance(msg, dict):
                    return msg
            if not wait_readable([self.status_fd], deadline - time.monotonic()):
                raise KeeperGone("the program's keeper said nothing")
            data = os.read(self.status_fd, 4096)
            if not data:
                raise KeeperGone("the program's keeper ended without its answer")
            try:
                self._frames = iter(list(self._reader.feed(data)))
            except FrameError as e:
                raise KeeperGone(f"the program's keeper: {e}") from None

    def returncode(self) -> int:
        """The program's exit status (-N: signal N), once ``status_fd`` is readable."""
        if self._rc is None:
            self._rc = int(self._next(END_WITHIN + 20)["status"])
        return self._rc

    def end(self) -> int:
        """End the program's tree now; its exit status."""
        if self._rc is None:
            try:
                write_all(self._control, END)
            except OSError:
                pass
        return self.returncode()

    def close(self) -> None:
        """Reap the keeper (ended first if it still runs) and close the pipes."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._rc is None and self.pid:
                try:
                    self.end()
                except KeeperGone:
                    pass
        finally:
            os.close(self._control)  # the keeper's cue: it removes the host directory, exits
            deadline = time.monotonic() + END_WITHIN + 5
            while os.waitpid(self.keeper, os.WNOHANG) == (0, 0):
                if time.monotonic() > deadline:
                    kill_group(self.keeper)
                    os.waitpid(self.keeper, 0)
                    break
                time.sleep(0.01)
            os.close(self.status_fd)

    def __enter__(self) -> ProgramKeeper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# Signals a stray kill of the keeper must not end it by: only the tree's end and umbp-sim's end
# it. Its program gets them back at their defaults (preexec).
_KEEPER_IGNORES = (signal.SIGINT, signal.SIGPIPE, *TERMINATING_SIGNALS)


def _keep(
    owner: int,
    command: Sequence[str],
    env: dict[str, str],
    pass_fd: int,
    preexec: Callable[[int], None],
    host_dir: str,
    status: int,
    control: int,
) -> None:
    for sig in _KEEPER_IGNORES:
        signal.signal(sig, signal.SIG_IGN)
    os.setpgid(0, 0)  # out of umbp-sim's group: a kill of that group leaves us to clean up
    become_subreaper()
    watch = pidfd(owner)
    try:
        _run(owner, command, env, pass_fd, preexec, status, control, watch)
    finally:
        os.close(status)  # all said (or a failure here: umbp-sim reads the end, not a wait)
        # umbp-sim closed its end of the control pipe (it is done with the run) or died: the
        # tree is ended by now, and nothing of the run needs the host directory any more.
        _until_done(owner, control, watch)
        shutil.rmtree(host_dir, ignore_errors=True)


def _until_done(owner: int, control: int, watch: int | None) -> None:
    """Wait for the end of umbp-sim's control pipe, or umbp-sim's death."""
    fds = [control] + ([watch] if watch is not None else [])
    while True:
        ready = wait_readable(fds, 0.5)
        if watch is not None and watch in ready:
            return
        if control in ready and not os.read(control, 64):
            return
        if watch is None and os.getppid() != owner:
            return


def _run(
    owner: int,
    command: Sequence[str],
    env: dict[str, str],
    pass_fd: int,
    preexec: Callable[[int], None],
    status: int,
    control: int,
    watch: int | None,
) -> None:
    """Start the program, tell umbp-sim its pid, wait for its end (or umbp-sim's word, or its
    death), end the tree, tell umbp-sim the program's exit status."""
    me = os.getpid()

    def in_program() -> None:
        for sig in _KEEPER_IGNORES:
            signal.signal(sig, signal.SIG_DFL)
        die_with_parent(me)
        preexec(me)

    try:
        proc = subprocess.Popen(list(command), env=env, pass_fds=(pass_fd,), preexec_fn=in_program)
    except (OSError, subprocess.SubprocessError) as e:  # no such file; a failed set-up
        why = getattr(e, "strerror", None) or str(e)
        write_all(status, frame(dumps({"error": why, "errno": getattr(e, "errno", 0) or 0})))
        return
    os.close(pass_fd)
    write_all(status, frame(dumps({"pid": proc.pid})))
    exited = pidfd(proc.pid)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the terminal and umbp-sim's pipes are the program's, not ours
        os.dup2(devnull, fd)
    keep = {0, 1, 2, status, control, exited, watch}
    for fd in open_fds():  # umbp-sim's: nobody waits on us for an EOF
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    fds = [control] + [fd for fd in (exited, watch) if fd is not None]
    while True:
        ready = wait_readable(fds, 0.5)
        if exited is not None and exited in ready:
            break
        if control in ready or (watch is not None and watch in ready):
            break  # "end", or the end of the pipe: umbp-sim is gone (or going)
        if exited is None and os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
            break
        if watch is None and os.getppid() != owner:
            break
    # The program's status before the tree goes (it is not reaped until then: its pid, its
    # group's id, stays ours): its own exit, or the SIGKILL that ends it now.
    info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    if info is None:
        kill_group(proc.pid)
        if exited is not None:
            wait_readable([exited], END_WITHIN)
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    kill_group(proc.pid)
    end_tree(time.monotonic() + END_WITHIN)
    rc = _returncode(info) if info is not None else -int(signal.SIGKILL)
    try:
        write_all(status, frame(dumps({"status": rc})))
    except OSError:
        pass
