"""The one function that performs a ``Run``: ``execute(run, subject) -> RunRecord``.

The stack of one run::

    allocator -> TracingKernel -> FaultyKernel (the run's plan) -> SimKernel (the machine)

``subject`` is the allocator under test (``umbp_sim.engine.subject``): the built-in one in this
process, or an external build in the forked child of its server (its calls in the interposer's
scope). In order: a fresh SimKernel in the machine's state, the run's admin writes, the work
(``umbp_sim.engine.work``), the counters ``run.counters`` names (before cleanup), the free of
what the work holds, then the leaks (none counted after a crash: the process is dead), the
syscall trace and SimKernel's reasons. A simulated crash (``SimulatedCrash``) is the outcome
``crashed`` with the stage it happened in.
"""

from __future__ import annotations

from typing import Any

from umbp_sim import _native
from umbp_sim.engine.counters import read_counters
from umbp_sim.engine.host_changes import apply_change
from umbp_sim.engine.record import RunRecord, handle_record
from umbp_sim.engine.spec import Alloc, Run, SglangStartup, Steps
from umbp_sim.engine.subject import Subject
from umbp_sim.engine.work import Held, raised, registry_probe, run_alloc, run_steps, start_sglang
from umbp_sim.errors import SimulatedCrash
from umbp_sim.host.leaks import collect_leaks
from umbp_sim.host.trace import instrument, made_by
from umbp_sim.machine import Machine
from umbp_sim.sim import SimHost, to_sim_config
from umbp_sim.vocabulary.log_capture import capture_logs

WARNING_LOGGERS = ("umbp_sim", "sglang")
ALLOCATOR_LOGGER = "umbp_sim.allocator"

# SimConfig by machine state (its repr: every field): building it is most of a short run's
# cost, and compare's runs share a few machines. An external build's server fills it before it
# forks, so its children find it (host_config in run_job.prepare). SimKernel copies the config.
_CONFIGS: dict[str, Any] = {}


def host_config(machine: Machine) -> Any:
    """The SimConfig of ``machine``'s state (validated), built once per state."""
    key = repr(machine)
    config = _CONFIGS.get(key)
    if config is None:
        if len(_CONFIGS) >= 256:
            _CONFIGS.clear()
        config = _CONFIGS[key] = to_sim_config(machine)
    return config


def fresh_host(machine: Machine) -> SimHost:
    """A SimHost of its own in ``machine``'s state."""
    return SimHost(machine, _native.SimKernel(host_config(machine)))


def execute(run: Run, subject: Subject) -> RunRecord:
    """``run`` on ``subject``, on a fresh simulated host: what came of it."""
    rec = RunRecord(outcome="ok")
    host = fresh_host(run.machine)
    rec.setup_notes = [n for n in (apply_change(host, c) for c in run.changes) if n]
    if run.keep_state:
        rec.host_state = host.state()
    stack = instrument(host.kernel, run.plan)
    held = Held()
    counted = False
    with capture_logs(WARNING_LOGGERS) as logs:
        subject.attach(stack.kernel)
        try:
            work = run.work
            if isinstance(work, Alloc):
                run_alloc(work, subject, host, rec, held)
            elif isinstance(work, Steps):
                run_steps(work, subject, host, rec, held)
            elif isinstance(work, SglangStartup):
                start_sglang(work, dict(run.env), subject, host, rec, held)
            else:
                raise TypeError(f"a simulated run cannot do {type(work).__name__}")
            if run.keep_state:  # what the buffer leaves the host: a fix's margin
                rec.state_after = host.state()
            rec.counters, counted = read_counters(host, run.counters), True
            held.stage = "free"
            subject.stage("free")
            _free(run, subject, rec, held)
        except SimulatedCrash as e:
            rec.outcome, rec.failure, rec.error, rec.null_alloc = "crashed", None, str(e), None
            rec.signal, rec.crash_node, rec.detail = e.signal, e.node, e.detail
            rec.stage, rec.simulated = held.stage, True
            if not counted:  # the counters of the host it died on
                rec.counters = read_counters(host, run.counters)
        finally:
            subject.detach(stack.kernel)
        subject.stage("exit")
        records = stack.tracing.records()
        if rec.outcome != "crashed":  # a dead process leaks nothing
            a = held.allocator
            mine = [a] if a is not None and hasattr(a, "snapshot") else []
            rec.leaks = collect_leaks(host, *mine, stack.kernel)
            mappings, fds = stack.tracing.live_mappings(), stack.tracing.open_fds()
            rec.held = {"mappings": len(mappings), "fds": len(fds)}
            rec.leaked_by = made_by(records, mappings, fds)
        rec.trace = [r.text() for r in records]
        rec.trace_dropped = stack.tracing.dropped
        sites = [r.site for r in records]
        if any(s >= 0 for s in sites):  # an external build's calls, from the interposer
            rec.trace_sites, rec.call_sites = sites, stack.tracing.call_sites()
        rec.reasons = host.reasons()
    rec.warnings = list(logs.messages)
    rec.allocator_warnings = logs.of(ALLOCATOR_LOGGER)
    rec.allocator_levels = logs.levels_of(ALLOCATOR_LOGGER)
    rec.log = list(logs.log)
    return rec


def _free(run: Run, subject: Subject, rec: RunRecord, held: Held) -> None:
    """Free what the work holds (an Alloc run that asks to keep its buffer keeps it); a free
    that raises is the outcome failed ("free: ..."), as a server's log would show it."""
    if isinstance(run.work, Alloc) and not run.work.free:
        return
    try:
        with subject.scope():
            for startup in held.startups:
                startup.close()
            if held.allocator is not None:
                for h in held.handles:
                    held.allocator.free(h)
                if held.probe is not None:  # what Free left of its registration
                    after = registry_probe(subject, held.allocator, held.probe)
                    rec.registry = f"{rec.registry}; after free {after}"
                if isinstance(run.work, Alloc) and held.handles:  # an Alloc's one buffer
                    rec.after_free = handle_record(held.handles[-1])
                if isinstance(run.work, Alloc) and run.work.free_twice:
                    for h in held.handles:  # a second free of the same handle: a no-op
                        held.allocator.free(h)
    except subject.harness_errors:
        raise
    except Exception as e:  # noqa: BLE001 - the allocator's exception is the outcome
        rec.outcome, rec.failure, rec.error = "failed", "raised", f"free: {raised(e)}"
        rec.null_alloc = None
