"""Run a scenario and compare what happened with what it expects.

A scenario is one engine ``Run`` (``umbp_sim.engine``): its ``[machine]`` (``build_host.py``),
its ``[[faults]]``, its ``[request]`` (one alloc, steps, or sglang's host pool), its ``[env]``
and the counters ``[expect].counters`` names (read after the request, before cleanup). The
record's outcome (``ok``, ``demoted``, ``failed``, ``crashed``: ``umbp_sim.engine.record``) is
what ``[expect].outcome`` names.
"""

from __future__ import annotations

from umbp_sim.allocator_profiles import FIELD_PROFILE, canonical_profile
from umbp_sim.engine.record import RunRecord
from umbp_sim.engine.spec import Alloc, Run, RunError, SglangStartup, Steps, Work
from umbp_sim.errors import UmbpSimError
from umbp_sim.faults import FaultPlan
from umbp_sim.machine import Machine
from umbp_sim.request import AllocRequest
from umbp_sim.scenario.build_host import build_machine
from umbp_sim.scenario.observed import ScenarioResult, compare
from umbp_sim.scenario.schema import Scenario, ScenarioError

__all__ = [
    "ScenarioError",
    "ScenarioResult",
    "build_machine",
    "compare",
    "observe",
    "run_scenario",
    "scenario_profile",
    "scenario_run",
]


def scenario_profile(scn: Scenario, profile: str | None = None) -> str:
    """The allocator profile a scenario runs with: its own, else ``profile``, else the field's."""
    return canonical_profile(scn.allocator or profile or FIELD_PROFILE)


def run_scenario(scn: Scenario, profile: str | None = None) -> ScenarioResult:
    """Run ``scn``; a scenario naming no allocator runs with ``profile`` (default: the field's)."""
    rec = observe(scn, build_machine(scn), profile=profile)
    return ScenarioResult(scn, rec, compare(scn.expect, rec, scn.path))


def scenario_run(
    scn: Scenario, machine: Machine, allocator: str, env: dict[str, str] | None = None
) -> Run:
    """The engine's ``Run`` of ``scn`` on ``machine`` and ``allocator`` (``env``: the
    allocator process's environment; default: the scenario's ``[env]``)."""
    try:
        plan = FaultPlan.from_rules(scn.faults, scn.fault_seed) if scn.faults else None
    except (UmbpSimError, ValueError) as e:
        raise ScenarioError(f"{scn.path}: {e}") from None
    work: Work
    if scn.request_kind == "sglang":
        work = SglangStartup(dict(scn.request), scn.sglang)
    elif scn.request_kind == "steps":
        work = Steps(tuple(scn.request["steps"]))
    else:
        work = Alloc(AllocRequest.from_table(scn.request))
    return Run(
        machine,
        work,
        allocator=allocator,
        plan=plan,
        env=tuple((scn.env if env is None else env).items()),
        counters=tuple(scn.expect.get("counters", {})),
        label=scn.label,
    )


def observe(scn: Scenario, machine: Machine, profile: str | None = None) -> RunRecord:
    """Run ``scn``'s request on a SimKernel built from ``machine``, with
    :func:`scenario_profile`'s allocator."""
    return run_checked(scn, scenario_run(scn, machine, scenario_profile(scn, profile)))


def run_checked(scn: Scenario, run: Run) -> RunRecord:
    """``run_router.run(run)``; a request or counter the run cannot do is ``scn``'s error."""
    from umbp_sim import run_router  # above the engine: on the first run, not at import

    try:
        return run_router.run(run)
    except RunError as e:
        raise ScenarioError(f"{scn.path}: {e}") from None
