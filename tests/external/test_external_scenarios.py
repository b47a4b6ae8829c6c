"""Scenario files on an external allocator (`run --allocator PATH`): each runs as a replay's
request does, in a forked child of the build's server, counters read there; steps with ops that
mori's Python surface lacks and scenarios written for umbp-sim are listed as not run, never as
failures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from umbp_sim.cli import main
from umbp_sim.external.observe import close_runners
from umbp_sim.scenario.bundled import bundled_scenarios_dir
from umbp_sim.scenario.external_scenario import run_scenario_external
from umbp_sim.scenario.schema import ScenarioError, load_scenario

SCENARIOS = bundled_scenarios_dir()
HEAD = "umbp_sim_scenario = 1\n[scenario]\nname = 'x'\ndescription = 'd'\nsource = 's'\n"


def _find(name: str) -> Path:
    found = sorted(SCENARIOS.rglob(name))
    assert found, name
    return found[0]


def _scenario(path: Path, body: str) -> Path:
    """A scenario file: the common [scenario] head, then ``body``."""
    path.write_text(HEAD + body)
    return path


@pytest.fixture
def run_on(tiny_builds: dict[str, str]):  # type: ignore[no-untyped-def]
    def run(path: Path):  # type: ignore[no-untyped-def]
        return run_scenario_external(load_scenario(path), tiny_builds["wrap"])

    yield run
    close_runners()


def test_what_runs_and_what_is_not_run(run_on) -> None:  # type: ignore[no-untyped-def]
    zero = run_on(_find("zero-size-silent.toml"))  # mori's: no warning, a null handle
    assert (zero.observed.outcome, zero.not_run) == ("failed", None)
    # Written for umbp-sim (its demotion and warning texts): not run, not failed.
    umbp = run_on(_find("per-node-exhaustion-populate-efault.toml"))
    assert (umbp.not_run, umbp.mismatches, umbp.passed) == (
        "its expectations are umbp-sim's ([scenario].allocator)",
        [],
        False,
    )
    # Steps run where mori's Python surface has their ops (alloc, free, set_nr_hugepages).
    held = run_on(_find("shm-free-deferred-still-held.toml"))
    assert held.not_run == (
        "steps use the shm registry (acquire), which the build does not have (mori's is C++ "
        "only: umbp-sim build-allocator --mori CHECKOUT binds it)"
    )
    double = run_on(_find("double-free.toml"))
    assert double.not_run is None and double.passed, double.mismatches
    assert double.observed.steps == ["alloc ok AnonymousHugetlb 536870912", "freed", "freed"]
    assert double.observed.counters == {"hugepages.2MiB.free": 1024, "hugepages.2MiB.reserved": 0}


@pytest.mark.torch  # sglang's host pool makes torch tensors
def test_an_sglang_scenario_runs_on_the_build(run_on) -> None:  # type: ignore[no-untyped-def]
    sglang = run_on(_find("mla-kv-split-three-buffers-no-leak.toml"))  # was: not run
    assert sglang.not_run is None and sglang.observed.outcome == "ok"
    assert sglang.passed, sglang.mismatches


def test_counters_are_read_in_the_child_before_cleanup(run_on) -> None:  # type: ignore[no-untyped-def]
    r = run_on(_find("no-prefault-reserves-only.toml"))
    assert r.observed.counters == {"hugepages.2MiB.free": 1024, "hugepages.2MiB.reserved": 512}
    assert r.passed, r.mismatches


def test_a_crash_says_the_counters_died_with_it(run_on, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    scn = _scenario(
        tmp_path / "crash.toml",
        "[machine]\nnodes = 2\nmem_per_node = '16GiB'\n"
        "hugepages_per_node = [{ '2MiB' = 1024 }, { '2MiB' = 0 }]\n"
        "[request]\nsize = '1GiB'\nbacking = 'AnonymousHugetlb'\nnuma_node = 1\n"
        "[expect]\noutcome = 'crashed'\nsignal = 'SIGBUS'\n"
        "counters = { 'hugepages.2MiB.free' = 1024 }\n",
    )
    r = run_on(scn)
    assert r.observed.outcome == "crashed"
    assert r.mismatches == [
        "counters: not read: the allocator's process was killed by SIGBUS (its simulated host "
        "died with it)"
    ]


def test_a_bad_counter_is_the_files_error(run_on, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    scn = _scenario(
        tmp_path / "bad.toml",
        "[machine]\nnodes = 1\nmem_per_node = '16GiB'\n[request]\nsize = '4MiB'\n"
        "backing = 'Anonymous'\n[expect]\noutcome = 'ok'\n"
        "counters = { 'hugepages.2MiB.nope' = 1 }\n",
    )
    bad = r"bad\.toml: \[expect\]\.counters\.hugepages\.2MiB\.nope: no such counter"
    with pytest.raises(ScenarioError, match=bad):
        run_on(scn)


def test_run_command_counts_not_run_apart(
    tiny_builds: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    tiny = tiny_builds["wrap"]
    argv = ["run", "--allocator", tiny, "--json", "-k", "*-reserves-only*"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["passed"], doc["failed"], doc["not_run"]) == (1, 0, 0)
    # Only scenarios written for umbp-sim match: nothing ran, which must not pass.
    assert main(["run", "--allocator", tiny, "-k", "per-node-exhaustion-populate-efault"]) == 1
    out = capsys.readouterr()
    assert out.out.splitlines()[-1] == "0 passed, 0 failed, 1 not run"
    assert f"not run on {tiny}: 1 scenario(s): its expectations are umbp-sim's" in out.out
    assert out.err == f"umbp-sim run: no matching scenario can run on {tiny}\n"
