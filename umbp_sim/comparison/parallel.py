"""``compare --jobs N``: the runs spread over N worker processes, compared in run order.

Each worker is a forked process with its own pair of allocator runners (so an external build
gets one server process per worker, and the built-in allocator one interpreter per worker). The
parent hands out small chunks of run indices as workers become idle; a worker compares each run's
two outcomes and sends back the differences (and each outcome in one line, for --html); the
parent yields them in the order of ``runs``, so the comparison built from them (its JSON and
its report) is the serial one, byte for byte. ``on_done`` is called once per finished run,
whichever worker finished it (the progress bar).

A worker that cannot run an allocator reports why (``CouldNotRun``, compare's exit 2); a worker
that dies, or leaving the iteration early (Ctrl-C, SIGTERM, an error), ends every worker: each
closes its allocator servers (an idle one exits when its pipe closes, a busy one is killed with
its process group), and the parent waits for all of them, so no process is left behind. A worker
takes SIGTERM when its parent dies (``PR_SET_PDEATHSIG``), and its servers SIGKILL when it does
(``umbp_sim.external.procs``).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from umbp_sim.allocator_spec import AllocatorSpec
from umbp_sim.comparison.differences import Compared, compare_run
from umbp_sim.comparison.fault_reuse import FaultFreeTwin
from umbp_sim.engine.spec import Run
from umbp_sim.external.procs import die_with_parent
from umbp_sim.external.runner import DEFAULT_RUN_TIMEOUT, CouldNotRun
from umbp_sim.run_router import open_allocator

MAX_CHUNK = 64  # runs handed to a worker at a time: about 1/20 of its share, 1..64
_GRACE = 15.0  # seconds a worker gets to close its allocator servers once told to stop


def _close(opened: list[Any], conn: multiprocessing.connection.Connection) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # closing is not interrupted again
    for r in opened:
        r.close()
    conn.close()


def _worker(
    conn: multiprocessing.connection.Connection,
    specs: tuple[AllocatorSpec, AllocatorSpec],
    env: dict[str, str],
    runs: Sequence[Run],
    parent: int,
    run_timeout: float,
) -> None:
    """In a worker: open both runners, then run each chunk of indices the parent sends."""
    for sig in (signal.SIGINT, signal.SIGHUP):  # the parent decides; it ends us on these
        signal.signal(sig, signal.SIG_IGN)
    opened: list[Any] = []

    def terminate(_sig: int, _frame: Any) -> None:
        # Close the servers here and leave: an exception raised from a signal handler can land
        # where Python ignores it (a weakref callback, a __del__: "Exception ignored in ...")
        # and the worker would go on.
        _close(opened, conn)
        os._exit(0)

    signal.signal(signal.SIGTERM, terminate)
    die_with_parent(parent, signal.SIGTERM)  # a SIGKILLed parent still ends us (and ours)
    try:
        for spec in specs:
            opened.append(open_allocator(spec, env, run_timeout))
        a, b = opened
        twin = FaultFreeTwin()  # a chunk holds a fault-free run and its faulted ones after it
        conn.send(("idle",))
        while (chunk := conn.recv()) is not None:
            # The differences, not the outcomes: far less to pickle than two traces; each run's
            # as it ends (compare may stop at the runs after it: runs in a row timed out).
            for i in chunk:
                conn.send(("ran", [(i, *compare_run(runs[i], a, b, twin)[1:])]))
            conn.send(("done", []))
    except CouldNotRun as e:
        conn.send(("error", str(e)))
    except (EOFError, BrokenPipeError):
        pass  # the parent is gone: nothing to tell
    except Exception as e:  # noqa: BLE001 - told to the parent as one line, not a traceback
        conn.send(("error", f"a worker failed: {type(e).__name__}: {e}"))
    finally:
        _close(opened, conn)


class WorkerDied(CouldNotRun):
    """A worker process ended without saying why (killed)."""


def parallel_differences(
    spec_a: AllocatorSpec,
    spec_b: AllocatorSpec,
    runs: Sequence[Run],
    jobs: int,
    env: dict[str, str] | None = None,
    on_done: Callable[[], None] | None = None,
    run_timeout: float = DEFAULT_RUN_TIMEOUT,
) -> Iterator[Compared]:
    """``compare.compared(run, outcome on A, outcome on B)`` for each of ``runs``, in order,
    from ``jobs`` worker processes (each compares its runs). Raises ``CouldNotRun`` when an
    allocator cannot run or a worker dies."""
    ctx = multiprocessing.get_context("fork")  # the runs (and loaded modules) are inherited
    jobs = max(1, min(jobs, len(runs)))
    workers: list[tuple[Any, multiprocessing.connection.Connection]] = []
    finished = False
    try:
        for _ in range(jobs):
            parent_end, child_end = ctx.Pipe()
            proc = ctx.Process(
                target=_worker,
                args=(child_end, (spec_a, spec_b), dict(env or {}), runs, os.getpid(), run_timeout),
                daemon=True,
            )  # fmt: skip
            proc.start()
            child_end.close()  # here, before the next fork: a worker's death is EOF on its pipe
            workers.append((proc, parent_end))
        yield from _collect(workers, runs, on_done)
        finished = True
    finally:
        _stop(workers, force=not finished)


def _collect(
    workers: list[tuple[Any, multiprocessing.connection.Connection]],
    runs: Sequence[Run],
    on_done: Callable[[], None] | None,
) -> Iterator[Compared]:
    chunk_size = max(1, min(MAX_CHUNK, len(runs) // (len(workers) * 20)))
    todo = iter(range(0, len(runs), chunk_size))
    ready: dict[int, tuple[Any, ...]] = {}
    following = 0  # the next run to yield
    busy = {conn: proc for proc, conn in workers}
    while following < len(runs):
        for conn in multiprocessing.connection.wait(list(busy)):
            assert isinstance(conn, multiprocessing.connection.Connection)
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                raise _died(busy[conn]) from None
            if msg[0] == "error":
                raise CouldNotRun(msg[1])
            if msg[0] in ("ran", "done"):  # a run's outcome; "done": the worker is idle again
                for i, *compared_run in msg[1]:
                    ready[i] = compared_run
                    if on_done:
                        on_done()
            if msg[0] in ("done", "idle"):  # the next chunk, or nothing left for it
                start = next(todo, None)
                chunk = None
                if start is not None:
                    chunk = list(range(start, min(start + chunk_size, len(runs))))
                try:
                    conn.send(chunk)
                except OSError:  # it died after its last message (EPIPE): not the caller's pipe
                    raise _died(busy[conn]) from None
                if chunk is None:
                    conn.close()
                    del busy[conn]
        while following in ready:
            yield (runs[following], *ready.pop(following))  # type: ignore[misc]
            following += 1
    for conn in busy:  # every run is done: the workers still waiting for work stop
        try:
            conn.send(None)
        except OSError:
            pass  # it died since: nothing is missing (_stop waits for it)


def _died(proc: Any) -> WorkerDied:
    proc.join(1.0)
    return WorkerDied(f"a worker process died ({_exit_text(proc.exitcode)})")


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def _stop(workers: list[tuple[Any, multiprocessing.connection.Connection]], force: bool) -> None:
    """Wait for every worker; with ``force`` (an early end) SIGTERM them first (each closes its
    servers). SIGKILL for one still alive past the grace period."""
    for proc, _conn in workers:
        if force and proc.is_alive():
            try:
                os.kill(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    for proc, conn in workers:
        proc.join(_GRACE)
        if proc.is_alive():
            proc.kill()
            proc.join()
        if not conn.closed:
            conn.close()
