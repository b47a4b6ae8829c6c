"""A failing schedule becomes a scenario file that reproduces the failure on its own."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import tomli_w
from hypothesis import given, settings
from hypothesis.stateful import run_state_machine_as_test

from umbp_sim.explore import hypothesis_profiles as profiles
from umbp_sim.explore.schedule_to_scenario import ENV_VAR, machine_table, write_scenario
from umbp_sim.explore.stateful import AllocatorStateMachine
from umbp_sim.faults import FaultPlan
from umbp_sim.machine import Machine
from umbp_sim.scenario.scenario_run import build_machine, run_scenario
from umbp_sim.scenario.schema import load_scenario
from umbp_sim.strategies import machines

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


@profiles.active(max_examples=profiles.examples(30, 300))
@given(machine=machines())
def test_machine_table_round_trips_through_the_scenario_loader(
    machine: Machine, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = tmp_path_factory.mktemp("scn") / "m.toml"
    write_scenario(
        path,
        name="round trip",
        description="machine table",
        machine=machine,
        steps=[{"op": "alloc", "id": "a", "size": 4096}],
        expect={"outcome": "ok"},
    )
    scn = load_scenario(path)
    assert build_machine(scn) == machine
    assert scn.machine == {k: v for k, v in machine_table(machine).items()}


class BrokenMunmap(AllocatorStateMachine):
    """A kernel whose first munmap fails: the allocator invalidates the handle (as it must),
    and the mapping stays behind. The model does not know, so a property breaks."""

    fault_plan = FaultPlan.from_rules([{"op": "munmap", "errno": "EINVAL", "nth": 1}])
    save_name = "broken-munmap"


def test_shrunk_failure_is_saved_and_reproduces_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    with pytest.raises(AssertionError):
        run_state_machine_as_test(
            BrokenMunmap,
            settings=settings(
                profiles.active(),
                max_examples=100,
                stateful_step_count=10,
                database=None,
                derandomize=True,
                report_multiple_bugs=False,
            ),
        )
    path = tmp_path / "broken-munmap.toml"
    scn = load_scenario(path)
    assert scn.faults == [{"op": "munmap", "errno": "EINVAL", "nth": 1}]
    steps = scn.request["steps"]
    # Shrunk: one 1-byte anonymous allocation, its free (twice when the shrinker kept
    # double_free), at most one leftover no-op step.
    allocs = [s for s in steps if s["op"] == "alloc"]
    assert len(allocs) == 1 and len(steps) <= 4
    assert (allocs[0]["size"], allocs[0]["backing"]) == (1, "Anonymous")
    assert steps[-1]["op"] == "free"
    assert scn.machine == {"arch": "x86_64", "nodes": 1, "mem_per_node": 64 << 30,
                           "page_size": 4096}  # fmt: skip
    assert "observed: mappings [(" in scn.description
    result = run_scenario(scn)
    assert not result.passed
    assert any(m.startswith("leaks: ") and "still mapped" in m for m in result.mismatches)
    # Without the fault the same schedule is correct: the expectation is the model's.
    doc = tomllib.loads(path.read_text())
    del doc["faults"]
    fixed = tmp_path / "fixed.toml"
    fixed.write_text(tomli_w.dumps(doc))
    clean = run_scenario(load_scenario(fixed))
    assert clean.passed, clean.report()


REGRESSIONS = Path(__file__).resolve().parent.parent / "scenarios" / "regressions"


@pytest.mark.parametrize("path", sorted(REGRESSIONS.glob("*.toml")), ids=lambda p: p.stem)
def test_kept_regression_scenarios_pass(path: Path) -> None:
    result = run_scenario(load_scenario(path))
    assert result.passed, result.report()
