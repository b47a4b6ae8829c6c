"""Run a scenario on a simulated host and compare what happened with what it expects.

The stack for one scenario::

    allocator -> TracingKernel -> FaultyKernel (the [[faults]]) -> SimKernel (the [machine])

Outcomes: ``crashed`` (a simulated SIGBUS/SIGKILL), ``failed`` (a null handle or the caller's
error), ``demoted`` (hugepages asked for, 4 KiB pages given), ``ok``. Counters named in
``[expect].counters`` are read after the request and before cleanup; leaks are looked for after
cleanup (a crashed host is dead, so leaks are not counted there).
"""

from __future__ import annotations

from collections.abc import Callable

from umbp_sim import _context
from umbp_sim.allocator import UMBPHostMemAllocator
from umbp_sim.errors import SimulatedCrash, UmbpSimError
from umbp_sim.faults import FaultPlan
from umbp_sim.leaks import collect_leaks
from umbp_sim.log_capture import capture_logs
from umbp_sim.machine import Machine
from umbp_sim.profiles import FIELD_PROFILE, canonical_profile
from umbp_sim.scenario.build_host import build_machine
from umbp_sim.scenario.observed import Observed, ScenarioResult, compare, read_counters
from umbp_sim.scenario.run_request import (
    _null_handle_error,
    _run_alloc,
    _run_sglang,
    _run_steps,
    result_budget,
    sglang_request_of,
    zoneinfo_low_pages,
)
from umbp_sim.scenario.schema import Scenario, ScenarioError
from umbp_sim.sim import SimHost, simulate
from umbp_sim.trace import instrument, trace_text

WARNING_LOGGERS = ("umbp_sim", "sglang")
ALLOCATOR_LOGGER = "umbp_sim.allocator"

__all__ = [
    "ALLOCATOR_LOGGER",
    "WARNING_LOGGERS",
    "Observed",
    "ScenarioError",
    "ScenarioResult",
    "_null_handle_error",
    "build_machine",
    "compare",
    "observe",
    "result_budget",
    "run_scenario",
    "scenario_profile",
    "sglang_request_of",
    "zoneinfo_low_pages",
]


def scenario_profile(scn: Scenario, profile: str | None = None) -> str:
    """The allocator profile a scenario runs with: its own, else ``profile``, else the field's."""
    return canonical_profile(scn.allocator or profile or FIELD_PROFILE)


def run_scenario(scn: Scenario, profile: str | None = None) -> ScenarioResult:
    """Run ``scn``; a scenario naming no allocator runs with ``profile`` (default: the field's)."""
    machine = build_machine(scn)
    obs = observe(scn, machine, profile=profile)
    return ScenarioResult(scn, obs, compare(scn.expect, obs, scn.path))


def observe(
    scn: Scenario,
    machine: Machine,
    setup: Callable[[SimHost], None] | None = None,
    profile: str | None = None,
) -> Observed:
    """Run ``scn``'s request on a SimKernel built from ``machine``; ``setup`` runs first.

    ``setup`` applies admin writes (``host.set_nr_hugepages``) to the fresh host before the
    request: the replay tool re-runs a request with a proposed fix this way. The allocator
    follows :func:`scenario_profile`.
    """
    profile = scenario_profile(scn, profile)
    try:
        plan = FaultPlan.from_rules(scn.faults, scn.fault_seed) if scn.faults else None
    except (UmbpSimError, ValueError) as e:
        raise ScenarioError(f"{scn.path}: {e}") from None
    obs = Observed(outcome="ok")
    with simulate(machine) as host, capture_logs(WARNING_LOGGERS) as warnings:
        if setup is not None:
            setup(host)
        stack = instrument(host.kernel, plan)
        _context.push_kernel(stack.kernel)
        allocator = None
        handle = None
        startup = None
        try:
            if scn.request_kind == "sglang":
                startup = _run_sglang(scn, host, obs, profile)
            else:
                allocator = UMBPHostMemAllocator(kernel=stack.kernel, profile=profile)
                if scn.request_kind == "alloc":
                    handle = _run_alloc(scn, allocator, host, obs)
                else:
                    _run_steps(scn, allocator, host, obs)
        except SimulatedCrash as e:
            obs.outcome, obs.signal, obs.crash_node = "crashed", e.signal, e.node
            obs.error = str(e)
        finally:
            _context.pop_kernel(stack.kernel)
        obs.counters = read_counters(scn, host)
        if obs.outcome != "crashed":
            if handle is not None and allocator is not None:
                allocator.free(handle)
            if startup is not None:
                startup.close()
            obs.leaks = collect_leaks(*(s for s in (host, allocator, stack.kernel) if s))
        obs.trace = trace_text(stack.kernel, last=40)
        obs.reasons = host.reasons()
    obs.warnings = list(warnings.messages)
    obs.allocator_warnings = warnings.of(ALLOCATOR_LOGGER)
    obs.log = list(warnings.log)
    return obs
