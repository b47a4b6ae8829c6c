"""A scenario file on an external allocator: what ``run --allocator SPEC`` runs.

A scenario runs on an external build as on the built-in one: the same engine ``Run``
(``scenario.runner.scenario_run``), in one forked child of the allocator's server per run,
sglang's host pool included, with its ``[expect].counters`` read in the child before cleanup.
Not run, and said so:

- steps that acquire, look up or release on a build without the shm registry's functions
  (mori's registry is C++ only; a checkout built by ``build-allocator --mori`` has them,
  through umbp-sim's binding): alloc, free and set_nr_hugepages steps run on any build;
- scenarios written for another allocator (``[scenario].allocator = "umbp-sim"``): their
  expected fallbacks and warning texts are that allocator's. Those that name none or the field's
  allocator (mori-624002c) describe what mori does, and run.

A run past its time limit (``--run-timeout``) fails the scenario with "timed out after N s in
alloc" (the stage it was in; the outcome ``timeout``); one that could not run in umbp-sim's
process (its RLIMIT_AS left the buffer no real address space: ``runner.NoRoom``) fails it with
that line (the outcome ``could-not-run``); the next scenario runs.

Besides ``[expect]``, every scenario run on an external build is checked for what a build must
not do anywhere (``after_run_checks``): hold a mapping or fd after its cleanup (unless the
scenario says ``no_leaks = false``: the leak is what it describes), and leave a freed handle
otherwise than mori's Free does (ptr and sizes cleared, the backing and alignment kept).

mori prints its warnings only at log level warn, so a run sets ``MORI_UMBP_LOG_LEVEL=warn``
unless the scenario's ``[env]`` or the environment sets a mori level
(``profiles.with_mori_warnings``).
"""

from __future__ import annotations

import os

from umbp_sim.allocator_profiles import FIELD_PROFILE, canonical_profile, with_mori_warnings
from umbp_sim.allocator_spec import parse_allocator_spec
from umbp_sim.engine.counters import read_counters
from umbp_sim.engine.record import RunRecord
from umbp_sim.engine.spec import RunError
from umbp_sim.external.observe import runner_for
from umbp_sim.external.run_job import REGISTRY_FUNCTIONS
from umbp_sim.external.runner import NoRoom
from umbp_sim.scenario.observed import ScenarioResult, compare
from umbp_sim.scenario.scenario_run import build_machine, run_checked, scenario_run
from umbp_sim.scenario.schema import Scenario, ScenarioError
from umbp_sim.sim import host_view

# What mori's Python surface has: steps of these ops run on any build with it.
EXTERNAL_STEP_OPS = ("alloc", "free", "mapped", "set_nr_hugepages")


def steps_not_runnable(scn: Scenario, registry: bool) -> str | None:
    """Why ``scn``'s steps cannot run on an external build (None: they can, or it has none).
    ``registry``: the build has the shm registry (a checkout built with umbp-sim's binding,
    ``build-allocator --mori``), so acquire, lookup and release steps run too."""
    if scn.request_kind != "steps":
        return None
    runnable = set(EXTERNAL_STEP_OPS) | (set(REGISTRY_FUNCTIONS) if registry else set())
    ops = sorted({s["op"] for s in scn.request["steps"]} - runnable)
    if ops:
        return (
            f"steps use the shm registry ({', '.join(ops)}), which the build does not have "
            "(mori's is C++ only: umbp-sim build-allocator --mori CHECKOUT binds it)"
        )
    return None


def why_not_run(scn: Scenario, registry: bool) -> str | None:
    """Why ``scn`` cannot run on an external build (``registry``: one with the shm registry's
    functions), or None."""
    why = steps_not_runnable(scn, registry)
    if why is not None:
        return why
    if scn.allocator and canonical_profile(scn.allocator) != FIELD_PROFILE:
        return f"its expectations are {scn.allocator}'s ([scenario].allocator)"
    return None


def run_scenario_external(scn: Scenario, spec: str) -> ScenarioResult:
    """Run ``scn`` on the external allocator ``spec`` and compare with what the file expects."""
    # An allocator that cannot start ends the command; one that starts says what it has.
    runner = runner_for(parse_allocator_spec(spec))
    why = why_not_run(scn, runner.registry)
    if why is not None:
        return ScenarioResult(scn, None, [], not_run=why)
    machine = build_machine(scn)
    try:  # a bad key is the file's error, said here (not by the allocator's process)
        read_counters(host_view(machine), scn.expect.get("counters", {}))
    except RunError as e:
        raise ScenarioError(f"{scn.path}: {e}") from None
    env = with_mori_warnings(dict(scn.env), os.environ)
    try:
        rec = run_checked(scn, scenario_run(scn, machine, spec, env))
    except NoRoom as e:  # the analyst's RLIMIT_AS, not a verdict: the scenario fails with it
        rec = RunRecord("could-not-run", error=str(e))
    if rec.outcome == "timeout":
        return ScenarioResult(scn, rec, [f"{rec.error} (--run-timeout)"])
    if rec.outcome == "could-not-run":
        return ScenarioResult(scn, rec, [str(rec.error)])
    expect = scn.expect
    mismatches = []
    if rec.outcome == "crashed" and expect.get("counters"):
        expect = {k: v for k, v in expect.items() if k != "counters"}
        mismatches.append(
            f"counters: not read: the allocator's process was killed by {rec.signal} "
            "(its simulated host died with it)"
        )
    checked = compare(expect, rec, scn.path) + mismatches + after_run_checks(scn, rec)
    return ScenarioResult(scn, rec, checked)


# What mori's Free leaves of a handle, field by field (engine.record.handle_record's fields; a
# field the build's handle lacks is not checked); every other field stays as alloc returned it.
FREED = {"valid": False, "ptr": 0, "requested_size": 0, "mapped_size": 0, "fd": -1, "serial": 0}


def after_run_checks(scn: Scenario, rec: RunRecord) -> list[str]:
    """What every run on an external build is checked for, whatever its ``[expect]`` says:
    nothing held after cleanup (``[expect].no_leaks`` given either way says it), and a valid
    handle freed as mori's Free leaves one. A crashed run is not checked (its process died)."""
    if rec.outcome == "crashed":
        return []
    out = []
    if "no_leaks" not in scn.expect and rec.leaks:
        out.append(
            f"leaks: {'; '.join(rec.leaks)} (an external build's run leaves nothing held unless "
            "[expect].no_leaks = false)"
        )
    before, after = rec.handle_after_alloc, rec.after_free
    if before and after and before.get("valid"):
        want = {k: FREED.get(k, v) for k, v in before.items() if k in after}
        wrong = [k for k in want if after[k] != want[k]]
        if wrong:
            out.append(
                "handle after free: expected "
                + ", ".join(f"{k} {want[k]!r}" for k in wrong)
                + "; got "
                + ", ".join(f"{k} {after[k]!r}" for k in wrong)
            )
    return out
