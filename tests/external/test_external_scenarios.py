"""Scenario files on an external allocator (the hook for `run --allocator PATH`)."""

from __future__ import annotations

from pathlib import Path

from umbp_sim.allocator_spec import parse_allocator_spec
from umbp_sim.external.runner import open_allocator
from umbp_sim.external.scenario import run_scenario_external
from umbp_sim.scenario.bundled import bundled_scenarios_dir
from umbp_sim.scenario.schema import load_scenario

SCENARIOS = bundled_scenarios_dir()


def _find(name: str) -> Path:
    found = sorted(SCENARIOS.rglob(name))
    assert found, name
    return found[0]


def test_scenarios_on_the_test_allocator(tiny_builds: dict[str, str]) -> None:
    runner = open_allocator(parse_allocator_spec(tiny_builds["wrap"]))
    try:
        demote = run_scenario_external(
            load_scenario(_find("per-node-exhaustion-populate-efault.toml")), runner
        )
        assert demote.observed.outcome == "crashed" and demote.observed.signal == "SIGBUS"
        assert "outcome: expected 'demoted', got 'crashed'" in demote.mismatches
        zero = run_scenario_external(load_scenario(_find("zero-size-null-handle.toml")), runner)
        assert zero.observed.outcome == "failed"
        steps = [p for p in SCENARIOS.rglob("*.toml") if load_scenario(p).request_kind == "steps"]
        r = run_scenario_external(load_scenario(steps[0]), runner)
        assert r.mismatches == [
            f"not run on {tiny_builds['wrap']}: steps use umbp-sim's registry API"
        ]
    finally:
        runner.close()
