"""A replay's request on an external allocator: what ``replay``/``preflight --allocator SPEC`` run.

The diagnosis runs every simulation through ``umbp_sim.diagnose.run.run_allocator``; when the
allocator is an external build that call comes here. The request (a raw ``alloc`` or sglang's
host pool) runs in a forked child of the allocator's server process (``umbp_sim.external.child``)
on a SimHost built from the dumped machine, and comes back as the scenario runner's
``Observed``, SimKernel's reasons included, so the explanation and the fix search read it as they
read a built-in run. A real death (SIGBUS, SIGKILL) is the outcome ``crashed``: the reasons come
from the interposer's evidence (``umbp_sim.external.evidence``).

A fix's admin writes (``setup(host)``: ``host.set_nr_hugepages(...)``) are applied here to a
host built from the same machine through :class:`RecordingHost`, which records each call; the
child makes the same calls on its own fresh host (SimKernel is deterministic, so both hosts end
in the same state).

One server process per allocator and command: :func:`runner_for` opens it on first use,
:func:`close_runners` (the commands call it; also at exit) ends it.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from umbp_sim.allocator_spec import AllocatorSpec, AllocatorSpecError, parse_allocator_spec
from umbp_sim.errors import SimulatedCrash, UmbpSimError
from umbp_sim.external import run_job  # the server imports it here, before it forks
from umbp_sim.external.outcome import warning_lines
from umbp_sim.faults import FaultPlan
from umbp_sim.machine import Machine
from umbp_sim.scenario.observed import read_counters
from umbp_sim.scenario.runner import ALLOCATOR_LOGGER, Observed
from umbp_sim.scenario.schema import Scenario
from umbp_sim.sim import SimHost
from umbp_sim.warning_ids import warning_id

MPOL_BIND = 2

# ---- the parent side ---------------------------------------------------------------------------


@dataclass(frozen=True)
class HostCall:
    """One call a setup made on a SimHost: replayed on the child's host."""

    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    raised: bool  # it raised here (OSError: the kernel refused); the child expects the same


class RecordingHost:
    """A SimHost that records the method calls made on it (a fix's admin writes)."""

    def __init__(self, host: SimHost) -> None:
        self._host = host
        self.calls: list[HostCall] = []

    def __getattr__(self, name: str) -> Any:
        if name == "kernel":
            raise AttributeError(
                "a setup for an external allocator must use SimHost's methods, not host.kernel "
                "(its calls are replayed in the allocator's process)"
            )
        attr = getattr(self._host, name)
        if name.startswith("_") or not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                result = attr(*args, **kwargs)
            except Exception:
                self.calls.append(HostCall(name, args, kwargs, True))
                raise
            self.calls.append(HostCall(name, args, kwargs, False))
            return result

        return call


@dataclass(frozen=True)
class ObserveJob:
    """A request to observe in the allocator's process (picklable: sent to the server)."""

    machine: Machine
    kind: str  # "alloc" | "sglang" | "steps" | "run" | "verify" (preflight --verify's)
    request: dict[str, Any]  # the scenario table (alloc args, or sglang's model and sizes)
    env: dict[str, str] = field(default_factory=dict)
    sglang_release: str | None = None
    host_calls: tuple[HostCall, ...] = ()
    plan: FaultPlan | None = None
    run: Any = None  # a compare ``Run`` (kind "run"): ``run_job.run_in_child`` answers it
    scenario: Scenario | None = None  # the steps of kind "steps", and [expect].counters
    counters: bool = False  # read the scenario's [expect].counters after the request


_RUNNERS: dict[str, Any] = {}
_RUN_TIMEOUT: list[float] = []  # --run-timeout, when a command gave one


def set_run_timeout(seconds: float | None) -> None:
    """Each run's time limit (and the allocator's import's) for the servers started from now
    on (``None``: the default, ``runner.DEFAULT_RUN_TIMEOUT``)."""
    _RUN_TIMEOUT[:] = [] if seconds is None else [seconds]


def runner_for(spec: AllocatorSpec) -> Any:
    """The server process of ``spec``'s allocator, started on first use."""
    from umbp_sim.external.runner import (
        DEFAULT_RUN_TIMEOUT,
        CouldNotRun,
        ExternalRunner,
        RunTimedOut,
    )

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


def close_runners() -> None:
    """End every allocator server process this process started."""
    while _RUNNERS:
        _, runner = _RUNNERS.popitem()
        runner.close()


atexit.register(close_runners)


def observe_external(
    scn: Scenario,
    machine: Machine,
    setup: Callable[[Any], Any] | None,
    allocator: str,
    *,
    env: dict[str, str] | None = None,
    counters: bool = False,
) -> Observed:
    """``scn``'s request on the external allocator ``allocator`` (a SPEC), as ``Observed``.

    ``env``: the allocator process's environment for the run (default: the scenario's
    ``[env]``); ``counters``: read ``[expect].counters`` after the request, before cleanup.
    """
    from umbp_sim.scenario.runner import ScenarioError

    why = steps_not_runnable(scn)
    if why is not None:
        raise ScenarioError(f"{scn.path}: cannot run on an external allocator ({allocator}): {why}")
    calls: tuple[HostCall, ...] = ()
    if setup is not None:
        recording = RecordingHost(SimHost(machine))
        setup(recording)
        calls = tuple(recording.calls)
    plan = FaultPlan.from_rules(scn.faults, scn.fault_seed) if scn.faults else None
    job = ObserveJob(
        machine=machine,
        kind=scn.request_kind,
        request=dict(scn.request),
        env=dict(scn.env) if env is None else env,
        sglang_release=scn.sglang,
        host_calls=calls,
        plan=plan,
        scenario=scn if counters or scn.request_kind == "steps" else None,
        counters=counters,
    )
    from umbp_sim.external.runner import NoRoom, RunTimedOut

    runner = runner_for(parse_allocator_spec(allocator))
    try:
        return observed_from_reply(runner.observe(job))
    except RunTimedOut as e:
        raise RunTimedOut(f"--allocator {allocator}: a run {e} (--run-timeout)") from None
    except NoRoom as e:
        raise NoRoom(f"--allocator {allocator}: {e}") from None


# What mori's Python surface has: steps of these ops run on any build with it.
EXTERNAL_STEP_OPS = ("alloc", "free", "set_nr_hugepages")


def steps_not_runnable(scn: Scenario) -> str | None:
    """Why ``scn``'s steps cannot run on an external build (None: they can, or it has none)."""
    if scn.request_kind != "steps":
        return None
    ops = sorted({s["op"] for s in scn.request["steps"]} - set(EXTERNAL_STEP_OPS))
    if ops:
        return f"steps use umbp-sim's registry API ({', '.join(ops)})"
    return None


class ScopedAllocator:
    """An external build's allocator as the scenario runner's steps call it: the backing by
    name, each call in the interposer's scope."""

    def __init__(self, module: Any, ip: Any) -> None:
        self._module, self._ip = module, ip
        self._allocator = module.UMBPHostMemAllocator()

    def alloc(self, size: int, backing: Any, hugepage_size: int, node: int, prefault: bool) -> Any:
        enum = getattr(self._module.UMBPHostBufferBacking, getattr(backing, "name", backing))
        with self._ip.scope():
            return self._allocator.alloc(size, enum, hugepage_size, node, prefault)

    def free(self, handle: Any) -> None:
        with self._ip.scope():
            self._allocator.free(handle)


def observed_from_reply(reply: dict[str, Any]) -> Observed:
    """The scenario runner's ``Observed`` from what the server saw of one forked run."""
    from umbp_sim.external.runner import (
        NoRoom,
        RunTimedOut,
        failure_text,
        no_room_text,
        timed_out_text,
    )

    log = reply["log"]
    allocator_lines = warning_lines(log)
    result = reply["result"]
    if reply.get("timed_out") is not None:
        raise RunTimedOut(timed_out_text(reply))
    why = no_room_text(reply)
    if why is not None:
        raise NoRoom(why)
    if reply.get("stopped") is not None:
        stage = reply["stages"][-1] if reply["stages"] else "start"
        obs = Observed(outcome="crashed", signal=reply["stopped"])
        obs.error = f"stopped by {reply['stopped']} during {stage} (umbp-sim ended the process)"
        obs.warnings = list(allocator_lines)
    elif reply["signal"] is not None:
        import signal as _signal

        try:
            sig = _signal.Signals(reply["signal"]).name
        except ValueError:
            sig = f"signal {reply['signal']}"
        death = reply.get("evidence")  # the interposer's (umbp_sim.external.evidence)
        stage = reply["stages"][-1] if reply["stages"] else "start"
        obs = Observed(outcome="crashed", signal=sig)
        if death is not None and death.crash is not None:  # SimKernel's record of the death
            c = death.crash
            obs.crash_node = c.node
            # In the request itself (alloc) it reads as a built-in run's (SimulatedCrash);
            # later, the stage says which part of the process's life died (free, exit).
            obs.error = str(SimulatedCrash(sig, c.where, c.node, c.hugepage_size, c.detail))
            if stage != "alloc":
                head, sep, rest = obs.error.partition(": ")
                obs.error = f"{head} (in {stage}){sep}{rest}"
        else:  # injected, or a real signal of the allocator's own
            detail = death.detail if death is not None else ""
            obs.error = f"killed by {sig} during {stage}" + (f": {detail}" if detail else "")
        obs.reasons = list(death.reasons) if death is not None else []
        obs.trace = "\n".join(death.trace[-40:]) if death is not None else ""
        partial = reply.get("partial") or {}
        obs.warnings = list(allocator_lines)
        obs.budget = partial.get("budget")
    elif result is None:
        raise UmbpSimError(f"the allocator's process failed: {failure_text(reply)}")
    else:
        obs = result["observed"]
        obs.warnings = allocator_lines + list(obs.warnings)  # the allocator spoke first
    obs.allocator_warnings = allocator_lines
    obs.log = list(obs.log) + [(ALLOCATOR_LOGGER, warning_id(w), w) for w in allocator_lines]
    return obs


# ---- the child side (in the forked process) ----------------------------------------------------


def bound_node(host: SimHost, ptr: int) -> int:
    """The node the mapping at ``ptr`` is bound to (MPOL_BIND to one node), else -1."""
    for m in host.mappings():
        if m.start <= ptr < m.start + m.length:
            if m.policy_mode == MPOL_BIND and len(m.policy_nodes) == 1:
                return int(m.policy_nodes[0])
            return -1
    return -1


def _backing_name(handle: Any) -> str:
    return str(getattr(handle.actual_backing, "name", handle.actual_backing)).rsplit(".", 1)[-1]


def observe_one(module: Any, ip: Any, job: ObserveJob, report: Callable[..., None]) -> Any:
    """In the forked child: ``job``'s request on a fresh simulated host, under the interposer
    (``Observed``; for a compare run, ``run_job.run_in_child``'s result dict)."""
    if job.run is not None:
        return run_job.run_in_child(module, ip, job.run, report)
    if job.kind == "verify":  # the real allocation: the interposer stays inactive
        from umbp_sim.diagnose.verify import child_main

        return child_main(job.request, module, report)
    from umbp_sim.backing import alloc_outcome
    from umbp_sim.leaks import collect_leaks
    from umbp_sim.log_capture import capture_logs
    from umbp_sim.request import AllocRequest
    from umbp_sim.scenario.run_request import _run_steps
    from umbp_sim.scenario.runner import WARNING_LOGGERS, _null_handle_error
    from umbp_sim.sim import simulate
    from umbp_sim.trace import instrument, trace_text

    os.environ.update(job.env)  # the server's environment (MORI_UMBP_LOG_LEVEL ...)
    obs = Observed(outcome="ok")
    with simulate(job.machine) as host, capture_logs(WARNING_LOGGERS) as warnings:
        for c in job.host_calls:
            try:
                getattr(host, c.name)(*c.args, **c.kwargs)
            except Exception:
                if not c.raised:
                    raise
        stack = instrument(host.kernel, job.plan)
        ip.activate(stack.kernel)
        handles: list[Any] = []
        startup = None
        allocator = None
        if job.kind == "alloc":
            size, backing, hp, node, prefault = AllocRequest.from_table(job.request).fields()
            report("alloc", no_room=run_job.no_room(job.machine, size))
            allocator = module.UMBPHostMemAllocator()
            try:
                with ip.scope():
                    h = allocator.alloc(
                        size, getattr(module.UMBPHostBufferBacking, backing), hp, node, prefault
                    )
            except Exception as e:  # noqa: BLE001 - what the allocator raised is the outcome
                obs.outcome, obs.error, h = "failed", f"{type(e).__name__}: {e}", None
            if obs.error:
                pass
            elif not h:
                obs.outcome, obs.error = "failed", _null_handle_error(size, backing, node)
            else:
                handles.append(h)
                obs.actual_backing = _backing_name(h)
                obs.outcome = alloc_outcome(backing, obs.actual_backing)
        elif job.kind == "steps":
            report("alloc")
            assert job.scenario is not None
            _run_steps(job.scenario, ScopedAllocator(module, ip), host, obs)  # type: ignore[arg-type]
        else:
            report("alloc")
            startup = _start_sglang(module, ip, job, host, obs, report)
            handles = list(startup.handles) if startup is not None else []
        if handles:
            last = handles[-1]
            obs.mapped_size = int(last.mapped_size)
            obs.bound_node = bound_node(host, int(last.ptr))
        if job.counters and job.scenario is not None:  # as the scenario runner: before cleanup
            obs.counters = read_counters(job.scenario, host)
        report("free")
        with ip.scope():
            if startup is not None:
                startup.close()
            elif allocator is not None:
                for h in handles:
                    allocator.free(h)
        obs.leaks = collect_leaks(host, stack.kernel)
        obs.trace = trace_text(stack.kernel, last=40)
        obs.reasons = host.reasons()
        ip.deactivate()
    obs.warnings = list(warnings.messages)
    obs.log = list(warnings.log)
    return obs


def _start_sglang(
    module: Any, ip: Any, job: ObserveJob, host: SimHost, obs: Observed, report: Callable[..., None]
) -> Any:
    """sglang's host-pool startup with ``module`` as ``mori.umbp`` (the allocator's calls are
    in the interposer's scope; Python's and torch's own go to the real kernel)."""
    from umbp_sim.scenario.runner import result_budget, sglang_request_of, zoneinfo_low_pages
    from umbp_sim.sglang import start_host_pool
    from umbp_sim.sglang.sizing import parse_meminfo

    request = sglang_request_of(job.request)
    meminfo = parse_meminfo(host.read("/proc/meminfo"), "/proc/meminfo")
    obs.budget = result_budget(meminfo, host)
    # What a death leaves the parent: the host check's numbers.
    report("alloc", budget=obs.budget)
    with ip.scope():
        result = start_host_pool(
            request,
            meminfo,
            env=job.env,
            module=module,
            keep=True,
            release=job.sglang_release,
            watermark_low_pages=zoneinfo_low_pages(host),
        )
    obs.outcome = "ok" if result.outcome == "fallback" else result.outcome
    obs.error, obs.signal = result.error, result.signal
    if result.handles:
        obs.actual_backing = _backing_name(result.handles[-1])
    return result


def load_torch() -> None:
    """Import torch in the server once (sglang's layer needs it; a forked child then has it)."""
    from umbp_sim._lsan import import_untracked

    import_untracked("numpy", "torch")  # under `tox -e asan`: their import leaks are not ours
    import umbp_sim.sglang  # noqa: F401
