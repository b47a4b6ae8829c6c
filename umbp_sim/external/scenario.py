"""A scenario file on an external allocator: what ``run --allocator PATH`` needs.

Only one-alloc scenarios can run on an external build (steps use umbp-sim's registry API, sglang
requests its Python layer); their ``[env]`` may set mori's log level (``MORI_*``), which the
allocator's process gets. Counters live in the child's
simulated host and are not reported: a scenario that expects counters says so in its result.
"""

from __future__ import annotations

from umbp_sim.external.outcome import AllocCall, Run
from umbp_sim.external.runner import AllocatorRunner
from umbp_sim.faults import FaultPlan
from umbp_sim.profiles import MORI_LOG_ENV
from umbp_sim.scenario.runner import (
    Observed,
    ScenarioResult,
    build_machine,
    compare,
)
from umbp_sim.scenario.schema import Scenario


def runnable(scn: Scenario) -> bool:
    return scn.request_kind == "alloc" and all(k in MORI_LOG_ENV for k in scn.env)


def to_run(scn: Scenario) -> Run:
    plan = FaultPlan.from_dict({"faults": scn.faults, "fault_seed": scn.fault_seed})
    call = AllocCall.from_table(scn.request)
    # A scenario observes the allocation; the user's first write is not part of it.
    return Run(
        build_machine(scn), call, plan=plan if scn.faults else None, write=False,
        env=tuple(sorted(scn.env.items())),
    )  # fmt: skip


def run_scenario_external(scn: Scenario, runner: AllocatorRunner) -> ScenarioResult:
    """Run ``scn`` on ``runner``'s allocator and compare with what the file expects."""
    if not runnable(scn):
        why = "sglang request" if scn.request_kind == "sglang" else (
            "steps use umbp-sim's registry API" if scn.request_kind == "steps"
            else "[env] sets more than MORI_*"
        )  # fmt: skip
        return ScenarioResult(
            scn, Observed(outcome="not run"), [f"not run on {runner.spec}: {why}"]
        )
    run = to_run(scn)
    obs = Observed.from_outcome(run.call.backing, runner.run(run))
    mismatches = compare({k: v for k, v in scn.expect.items() if k != "counters"}, obs)
    if scn.expect.get("counters"):
        mismatches.append(f"counters: not available from {runner.spec} (its host is in the child)")
    return ScenarioResult(scn, obs, mismatches)
