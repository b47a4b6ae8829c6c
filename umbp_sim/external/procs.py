"""The processes an external run starts, owned: bounded waits, process groups, a keeper.

The tree (``umbp_sim/external/``): the command (or a ``compare --jobs`` worker) starts an
allocator server in a process group of its own (``runner.ExternalRunner``); the server forks
each run into a process group of its own (``child.Forker``); what the allocator forks stays in
that run's group. So:

- a run is ended with its group (``kill_group``): whatever the allocator forked goes with it;
- the server and what it started are ended by its owner with the server's group;
- a server, a run child and a worker die with their parent (``die_with_parent``:
  ``PR_SET_PDEATHSIG``, set first thing, then ``getppid()`` checked for a parent that died
  before it was set);
- the *keeper*, a small process the server forks at start (``start_keeper``, in a group of its
  own so that killing the server's group leaves it), waits for the server's death however it
  comes (closed, killed, its owner SIGKILLed) and then ends the current run's group and the
  server's group: the allocator's forks do not outlive it.

A process that leaves its group on purpose (``setsid``, ``setpgid``) is out of reach of a
group's kill. ``umbp-sim exec`` holds its program's whole tree anyway: its keeper
(``umbp_sim.exec_host.keeper``) is the program's parent and a *child subreaper*
(``become_subreaper``: an orphan of the tree comes back to it, not to init), and ends the tree
by parent links (``end_tree``), whatever groups and sessions its processes made.

The waits here never block without a deadline: ``wait_readable`` bounds every read of a pipe
that someone else's fork may hold open.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import select
import signal
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from umbp_sim.errors import Terminated
from umbp_sim.external.wire import WireError, decode, encode

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
# Seconds a command told to end by SIGTERM/SIGHUP has for its finally blocks (workers get 15 s
# to close their servers) before a watchdog ends it, should the exception have been ignored.
_TERMINATED_GRACE = 60.0

_libc: Any = None


def _prctl(option: int, arg: int) -> int:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return int(_libc.prctl(option, arg, 0, 0, 0))


def die_with_parent(parent: int, sig: int = signal.SIGKILL) -> None:
    """In a child, first thing: ``sig`` when the parent (the thread that forked us) dies. A
    parent already gone (it died before the prctl) ends this process now."""
    _prctl(PR_SET_PDEATHSIG, int(sig))
    if os.getppid() != parent:
        os._exit(1)


def become_subreaper() -> bool:
    """Make this process a child subreaper (Linux 3.4): orphaned descendants are re-parented to
    it, so its tree stays findable by parent links. False where the kernel refuses."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1) == 0


def _parents() -> dict[int, tuple[int, str]]:
    """Every process's (parent pid, state letter), from /proc."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            out[int(entry)] = (int(fields[1]), fields[0].decode())
    return out


def _parent_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def descendants(root: int) -> dict[int, str]:
    """The descendants of ``root`` by parent links, each with its state letter ("Z": a zombie)."""
    table = _parents()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _state) in table.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[int, str] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid not in out:
            out[pid] = table[pid][1]
            todo.extend(children.get(pid, []))
    return out


def end_tree(deadline: float) -> bool:
    """SIGKILL every descendant of this process (a subreaper: what the tree orphans comes back
    to it) and reap its children, until none is left (True) or ``deadline`` (monotonic) passes.
    A pid is signalled through a pidfd opened while it is still in the tree, so a pid reused
    meanwhile is never hit."""
    me = os.getpid()
    while True:
        tree = descendants(me)
        live = [pid for pid, state in tree.items() if state != "Z"]
        owners = {me, *tree}
        for pid in live:
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue
            try:
                if _parent_of(pid) in owners:  # still the tree's (the pidfd holds it now)
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
            except OSError:
                pass
            finally:
                os.close(fd)
        reaped = False
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            reaped = True
        if not tree:
            return True
        if time.monotonic() > deadline:
            return False
        if not reaped:
            time.sleep(0.005)


def raise_address_space_limit() -> None:
    """Raise this process's soft RLIMIT_AS to its hard limit (no privilege needed): the
    analyst's ``ulimit -S -v`` is not the allocator's business. What the hard limit still
    refuses, SimKernel maps at an unbacked address (``run_job.no_room``)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
        except (ValueError, OSError):
            pass


def kill_group(pgid: int) -> None:
    """SIGKILL every process of group ``pgid`` (nothing if it has none left)."""
    if pgid > 1:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def signal_name(sig: int) -> str:
    """ "SIGBUS" for 7; "signal N" for a number with no name."""
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def pidfd(pid: int) -> int | None:
    """A pidfd for ``pid`` (readable once it has exited), or None where the kernel has none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def wait_readable(fds: list[int], timeout: float) -> list[int]:
    """The fds of ``fds`` readable within ``timeout`` seconds (``[]``: none)."""
    try:
        ready, _, _ = select.select(fds, [], [], max(0.0, timeout))
    except InterruptedError:  # pragma: no cover - select retries on EINTR since 3.5
        return []
    return ready


# ---- framing: 4-byte big-endian length + payload ---------------------------------------------


# A message is a job or a run's record: a trace of at most 100,000 calls (~10 MiB), not
# hundreds of MiB. Its decoding has bounds of its own (umbp_sim.external.wire).
MAX_FRAME = 64 << 20


class FrameError(ValueError):
    """Bytes on a protocol fd that are no message of umbp-sim's: a frame past MAX_FRAME, or a
    payload that is not the protocol's data (``umbp_sim.external.wire``)."""


class FrameReader:
    """Frames out of the bytes of a pipe, read as they come (``os.read``), never blocking."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> Iterator[bytes]:
        self._buf += data
        while len(self._buf) >= 4:
            (n,) = struct.unpack(">I", self._buf[:4])
            if n > MAX_FRAME:
                raise FrameError(f"a frame of {n:,} bytes (at most {MAX_FRAME:,})")
            if len(self._buf) < 4 + n:
                break
            frame = bytes(self._buf[4 : 4 + n])
            del self._buf[: 4 + n]
            yield frame


class StageBoard:
    """Frames a run's child posts to memory it shares with its server (``MAP_SHARED``, made
    before the fork), read by the server once the run has ended: a stage costs the child no
    system call and wakes nobody. What does not fit goes by the pipe (``post`` says False)."""

    SIZE = 1 << 16

    def __init__(self) -> None:
        self._mem = mmap.mmap(-1, self.SIZE)  # anonymous, shared with a child forked after

    def post(self, payload: bytes) -> bool:
        used = self._used()
        rec = frame(payload)
        if used + len(rec) > self.SIZE:
            return False
        self._mem[used : used + len(rec)] = rec
        self._mem[:4] = struct.pack(">I", used + len(rec))  # after it: only whole frames show
        return True

    def frames(self) -> Iterator[bytes]:
        """What was posted (the child's to write: a frame past its end or garbled stops it)."""
        return FrameReader().feed(self._mem[4 : self._used()])

    def _used(self) -> int:
        (n,) = struct.unpack(">I", self._mem[:4])
        return min(max(n, 4), self.SIZE)

    def close(self) -> None:
        self._mem.close()


def loads(payload: bytes) -> Any:
    """A message's payload as data (``umbp_sim.external.wire``: plain values and umbp-sim's own
    data classes, within its bounds); FrameError, one line, for anything else."""
    try:
        return decode(payload)
    except WireError as e:
        raise FrameError(str(e)) from None
    except MemoryError:
        raise FrameError("a message too large to hold") from None


def dumps(message: Any) -> bytes:
    """``message`` as a payload (``umbp_sim.external.wire.encode``)."""
    return encode(message)


def frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def write_within(
    fd: int, data: bytes, deadline: float, alive: Callable[[], bool] | None = None
) -> None:
    """``data`` down the non-blocking ``fd`` by ``deadline`` (monotonic): TimeoutError when it
    is not all taken by then, EOFError when ``alive()`` says the reader is gone, OSError (EPIPE)
    from the write as it comes."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            pass
        if view:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            select.select([], [fd], [], min(left, 0.25))
            if alive is not None and not alive():
                raise EOFError


# ---- the keeper --------------------------------------------------------------------------------


def start_keeper(
    server: int, server_group: bool = True, remove: str | None = None
) -> tuple[int, int]:
    """Fork the keeper of ``server`` (this process, the leader of its own group). Returns (its
    pid, the fd to tell it the current run's group on: ``tell_keeper``). A server that ends
    as it should tells it ``QUIT`` and reaps it; one that dies leaves it to do its work (and to
    be reaped by init). ``server_group=False``: ``server`` is a command's process in its
    caller's group (a shell's job): only the group it was told is ended, then the directory
    ``remove`` (build-allocator's compiler and its temporary directory)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the keeper: never returns
        try:
            os.setpgid(0, 0)  # out of the server's group: its owner's kill leaves us to clean up
            _keep(server, r, server_group, remove)
        finally:
            os._exit(0)
    os.close(r)
    return pid, w


def _keep(server: int, r: int, server_group: bool, remove: str | None) -> None:
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    watch = pidfd(server)
    keep = {0, 1, 2, r, watch}
    for fd in open_fds():  # the server's pipes among them: nobody waits on us for an EOF
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # only the server's death ends us
    run = 0
    reader = FrameReader()
    fds = [r] + ([watch] if watch is not None else [])
    while True:
        ready = wait_readable(fds, 0.5)
        if watch is not None and watch in ready:
            break
        if r in ready:
            data = os.read(r, 4096)
            if not data:
                fds.remove(r)
            for f in reader.feed(data):
                (run,) = struct.unpack(">i", f)
            if run == QUIT:
                return  # the server is ending as it should: nothing is left to us
        if watch is None and os.getppid() != server:
            break
    kill_group(run)
    if server_group:
        kill_group(server)
    if remove is not None:
        import shutil

        for _ in range(40):  # again while a process being killed still adds a file to it
            shutil.rmtree(remove, ignore_errors=True)
            if not os.path.lexists(remove):
                break
            time.sleep(0.05)


def open_fds() -> list[int]:
    """This process's open fds."""
    try:
        return [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(3, 256))


QUIT = -1  # told to the keeper by a server that ends as it should (it reaps the keeper)


def tell_keeper(fd: int | None, run_group: int) -> None:
    """Tell the keeper the current run's group (0: none; ``QUIT``: exit now)."""
    if fd is not None:
        try:
            write_all(fd, frame(struct.pack(">i", run_group)))
        except OSError:
            pass


# ---- SIGTERM, SIGHUP and the like in a command's process ------------------------------------


# The signals whose default action ends a process, but SIGINT (KeyboardInterrupt), SIGKILL and
# SIGSTOP, and those a fault raises (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS, SIGABRT:
# a crash of umbp-sim's own, not a request to end) and SIGPIPE, SIGXFSZ (Python ignores them:
# a write fails instead).
TERMINATING_SIGNALS: tuple[int, ...] = (
    signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
    signal.SIGALRM, signal.SIGVTALRM, signal.SIGPROF, signal.SIGXCPU, signal.SIGIO,
    signal.SIGPWR,
    *range(signal.SIGRTMIN, signal.SIGRTMAX + 1),
)  # fmt: skip


@contextmanager
def ended_by_signals(signals: tuple[int, ...] = TERMINATING_SIGNALS) -> Iterator[None]:
    """Every signal whose default would end the process (``TERMINATING_SIGNALS``: SIGTERM,
    SIGHUP, a stray SIGUSR1...; or ``signals``) raises ``Terminated`` in this process (its
    ``finally`` blocks end the workers and servers it started; the command exits 128 + the
    signal). A process forked from it meanwhile takes the signal's default action."""
    owner = os.getpid()

    def handler(sig: int, _frame: Any) -> None:
        if os.getpid() != owner:
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
            return
        # Python ignores an exception raised where the signal happens to land in a weakref
        # callback or a __del__ ("Exception ignored in ..."): the command would go on. A
        # watchdog ends it then, after the time the finally blocks need to end what it started.
        # It does not flush stdout: the main thread may hold its lock, blocked on a full pipe.
        watchdog = threading.Timer(_TERMINATED_GRACE, os._exit, (128 + sig,))
        watchdog.daemon = True
        watchdog.start()
        raise Terminated(sig)

    previous = {s: signal.signal(s, handler) for s in signals}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
