"""The parent side of an external allocator's runs: its server, and what a run's reply says.

An engine ``Run`` (``umbp_sim.engine``) on an external build goes to that allocator's server
process (``umbp_sim.external.child``), which forks a child per run; the child performs it with
the engine's ``execute`` under the interposer (``umbp_sim.external.run_job``) and the server
answers with what it saw: the child's ``RunRecord``, or its death (a real SIGBUS or SIGKILL is
the outcome ``crashed``: the reasons come from the interposer's evidence,
``umbp_sim.external.evidence``), a stop, or the time limit. :func:`record_from_reply` turns
that answer into the ``RunRecord``.

One server process per allocator and command: :func:`runner_for` opens it on first use,
:func:`close_runners` (the commands call it; also at exit) ends it.
"""

from __future__ import annotations

import atexit
import signal
from typing import Any

from umbp_sim.allocator_spec import AllocatorSpec, AllocatorSpecError
from umbp_sim.engine.execute import ALLOCATOR_LOGGER
from umbp_sim.engine.record import RunRecord
from umbp_sim.errors import SimulatedCrash
from umbp_sim.external.outcome import log_lines
from umbp_sim.external.runner import (
    DEFAULT_RUN_TIMEOUT,
    CouldNotRun,
    ExternalRunner,
    NoRoom,
    RunTimedOut,
    failure_text,
    no_room_text,
    timed_out_text,
)
from umbp_sim.vocabulary.warning_ids import warning_id

_RUNNERS: dict[str, ExternalRunner] = {}
_RUN_TIMEOUT: list[float] = []  # --run-timeout, when a command gave one


def set_run_timeout(seconds: float | None) -> None:
    """Each run's time limit (and the allocator's import's) for the servers started from now
    on (``None``: the default, ``runner.DEFAULT_RUN_TIMEOUT``)."""
    _RUN_TIMEOUT[:] = [] if seconds is None else [seconds]


def runner_for(spec: AllocatorSpec) -> ExternalRunner:
    """The server process of ``spec``'s allocator, started on first use."""
    runner = _RUNNERS.get(spec.name)
    if runner is None:
        timeout = _RUN_TIMEOUT[0] if _RUN_TIMEOUT else DEFAULT_RUN_TIMEOUT
        try:
            runner = _RUNNERS[spec.name] = ExternalRunner(spec, run_timeout=timeout)
        except RunTimedOut as e:  # its import did not end: exit 75, as a run past the limit
            raise RunTimedOut(f"--allocator {e}") from None
        except CouldNotRun as e:  # the SPEC names nothing that runs: a usage error here
            why = str(e).removeprefix(f"{spec}: ")
            raise AllocatorSpecError(f"--allocator {spec}: cannot run it: {why}") from None
    return runner


def has_registry(spec: AllocatorSpec, run_timeout: float = DEFAULT_RUN_TIMEOUT) -> bool:
    """Whether ``spec``'s allocator has the shm registry's calls: a built-in one, always; an
    external build when its server says so (started for the question within ``run_timeout``,
    the command's own limit, and ended: the command's runs start theirs). One that cannot start
    has none (the command's runs say why), but one whose import went past the limit raises
    RunTimedOut: the command reports it now, not after its runs wait the limit again."""
    if spec.kind == "builtin":
        return True
    try:
        runner = ExternalRunner(spec, run_timeout=run_timeout)
    except RunTimedOut:
        raise
    except CouldNotRun:
        return False
    try:
        return runner.registry
    finally:
        runner.close()


def close_runners() -> None:
    """End every allocator server process this process started."""
    while _RUNNERS:
        _, runner = _RUNNERS.popitem()
        runner.close()


atexit.register(close_runners)


def record_from_reply(reply: dict[str, Any]) -> RunRecord:
    """The ``RunRecord`` of one forked run from what the server saw of it: the child's record
    (the allocator's log lines, its stderr, first among the warnings), or its end: ``timeout``
    past the limit, ``crashed`` by a signal or a stop, ``could-not-run`` when it died without a
    result. ``NoRoom`` when it died of a real fault where this process had no address space."""
    log = reply["log"]
    leveled = log_lines(log)
    lines, levels = [text for _, text in leveled], [level for level, _ in leveled]
    stage = reply["stages"][-1] if reply["stages"] else "start"
    partial = reply.get("partial") or {}
    if reply.get("timed_out") is not None:
        rec = RunRecord("timeout", error=timed_out_text(reply), stage=stage)
    elif (why := no_room_text(reply)) is not None:
        raise NoRoom(why)
    elif reply.get("stopped") is not None:
        stopped = reply["stopped"]
        rec = RunRecord("crashed", signal=stopped, stage=stage, simulated=False)
        rec.detail = "the process stopped; umbp-sim ended it"
        rec.error = f"stopped by {stopped} during {stage} (umbp-sim ended the process)"
    elif reply["signal"] is not None:
        rec = _killed(reply["signal"], reply.get("evidence"), stage)
        rec.budget = partial.get("budget")
    elif reply["result"] is None:
        rec = RunRecord("could-not-run", error=failure_text(reply))
    else:
        rec = reply["result"]["record"]
        rec.warnings = lines + rec.warnings  # the allocator spoke first
        rec.allocator_warnings = lines
        rec.allocator_levels = levels
        rec.log = rec.log + [(ALLOCATOR_LOGGER, warning_id(w), w) for w in lines]
        return rec
    rec.warnings = list(lines)
    rec.allocator_warnings = list(lines)
    rec.allocator_levels = list(levels)
    rec.log = [(ALLOCATOR_LOGGER, warning_id(w), w) for w in lines]
    return rec


def _killed(signum: int, death: Any, stage: str) -> RunRecord:
    """A run killed by ``signum``: SimKernel's account from the interposer's evidence
    (``umbp_sim.external.evidence.Death``, None when the interposer wrote none), or a real
    signal of the allocator's own."""
    try:
        sig = signal.Signals(signum).name
    except ValueError:
        sig = f"signal {signum}"
    rec = RunRecord("crashed", signal=sig, stage=stage, simulated=death is not None)
    rec.detail = death.detail if death is not None else ""
    if death is not None and death.crash is not None:  # SimKernel's record of the death
        c = death.crash
        rec.crash_node = c.node
        # In the request itself (alloc) it reads as a built-in run's (SimulatedCrash);
        # later, the stage says which part of the process's life died (free, exit).
        rec.error = str(SimulatedCrash(**{**c.fields(), "signal": sig}))
        if stage != "alloc":
            head, sep, rest = rec.error.partition(": ")
            rec.error = f"{head} (in {stage}){sep}{rest}"
    else:  # injected, or a real signal of the allocator's own
        detail = rec.detail
        rec.error = f"killed by {sig} during {stage}" + (f": {detail}" if detail else "")
    rec.reasons = list(death.reasons) if death is not None else []
    rec.trace = list(death.trace) if death is not None else []
    if death is not None and death.call_sites:  # where its calls came from
        rec.trace_sites, rec.call_sites = list(death.trace_sites), list(death.call_sites)
    return rec
