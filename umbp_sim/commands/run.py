"""umbp-sim run: run scenario files and compare each outcome with what the file expects."""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from umbp_sim.scenario.scenario_run import ScenarioResult
    from umbp_sim.scenario.schema import Scenario


def add_arguments(p: argparse.ArgumentParser) -> None:
    from umbp_sim.vocabulary.flag_types import seconds_flag

    p.add_argument("paths", nargs="*", metavar="PATH", help="scenario files or directories")
    p.add_argument("-k", dest="pattern", help="only scenarios whose name or file matches (glob)")
    p.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    p.add_argument(
        "--allocator",
        default=None,
        metavar="NAME",
        help="allocator for scenarios that name none ([scenario].allocator): a profile, "
        "mori-624002c (default, alias mori: the field's) or umbp-sim; or an external build "
        "(a built .so with mori's Python API, or an importable module such as mori.umbp), "
        "which runs each scenario in its own process (at MORI_UMBP_LOG_LEVEL=warn unless a "
        "mori level is set) except scenarios written for umbp-sim and, on a build without "
        "the shm registry (mori's is C++ only; build-allocator --mori binds it), steps that "
        "acquire, look up or release: those are listed as not run",
    )
    p.add_argument(
        "--run-timeout",
        type=seconds_flag,
        default=None,
        metavar="SECONDS",
        help="an external --allocator: the time limit of each scenario's run and of the "
        "allocator's import (default 60); a run past it fails its scenario ('timed out after N "
        "s in STAGE') and the next one runs",
    )


def _selected(scn: Scenario, pattern: str | None) -> bool:
    if not pattern:
        return True
    glob = pattern if any(c in pattern for c in "*?[") else f"*{pattern}*"
    return fnmatch.fnmatch(scn.name, glob) or fnmatch.fnmatch(str(scn.path), glob)


def _expected(scn: Scenario) -> str:
    exp = scn.expect
    extra = exp.get("actual_backing") or exp.get("signal") or ""
    return f"{exp['outcome']} {extra}".strip()


def _got(r: ScenarioResult) -> str:
    o = r.observed
    if o is None:
        return "-"
    extra = o.actual_backing if o.outcome in ("ok", "demoted") else (o.signal or "")
    return f"{o.outcome} {extra or ''}".strip()


def run(args: argparse.Namespace) -> int:
    from umbp_sim.allocator_profiles import FIELD_PROFILE
    from umbp_sim.allocator_spec import parse_allocator_spec
    from umbp_sim.scenario.bundled import bundled_scenarios_dir
    from umbp_sim.scenario.scenario_run import run_scenario
    from umbp_sim.scenario.schema import find_scenarios_in, load_scenario

    paths = args.paths or [bundled_scenarios_dir()]
    # a directory given is the tree its scenarios' dumps may be in (schema.scenario_tree)
    scenarios = [load_scenario(p, root) for p, root in find_scenarios_in(paths)]
    scenarios = [s for s in scenarios if _selected(s, args.pattern)]
    spec = parse_allocator_spec(args.allocator or FIELD_PROFILE)
    if spec.kind == "builtin":
        results = [run_scenario(s, spec.name) for s in scenarios]
    else:
        from umbp_sim.external.observe import close_runners, set_run_timeout
        from umbp_sim.external.procs import ended_by_signals
        from umbp_sim.scenario.external_scenario import run_scenario_external

        set_run_timeout(args.run_timeout)
        try:
            with ended_by_signals():
                results = [run_scenario_external(s, str(spec)) for s in scenarios]
        finally:
            close_runners()
    not_run = [r for r in results if r.not_run is not None]
    failed = [r for r in results if not r.passed and r.not_run is None]
    passed = len(results) - len(failed) - len(not_run)
    if args.json:
        doc = {
            "passed": passed,
            "failed": len(failed),
            "not_run": len(not_run),
            "scenarios": [
                {
                    "file": str(r.scenario.path),
                    "name": r.scenario.name,
                    "passed": r.passed,
                    "not_run": r.not_run,
                    "expected": r.scenario.expect,
                    "observed": r.observed.to_json() if r.observed else None,
                    "mismatches": r.mismatches,
                }
                for r in results
            ],
        }
        json.dump(doc, sys.stdout, indent=2, default=str)
        print()
    else:
        width = max([len(r.scenario.name) for r in results] + [8])
        print(f"{'scenario':<{width}}  {'expected':<26} {'got':<26} result")
        for r in results:
            verdict = "NOT RUN" if r.not_run else "PASS" if r.passed else "FAIL"
            expected = _expected(r.scenario)
            print(f"{r.scenario.name:<{width}}  {expected:<26} {_got(r):<26} {verdict}")
        for r in failed:
            print()
            print(r.report())
        if not_run:
            print()
            for why, count in Counter(r.not_run for r in not_run).items():
                print(f"not run on {spec}: {count} scenario(s): {why}")
        print()
        tail = f", {len(not_run)} not run" if not_run else ""
        print(f"{passed} passed, {len(failed)} failed{tail}")
    if not results:
        print("umbp-sim run: no scenario matched", file=sys.stderr)
        return 1
    if len(not_run) == len(results):  # a check that ran nothing must not pass
        print(f"umbp-sim run: no matching scenario can run on {spec}", file=sys.stderr)
        return 1
    return 1 if failed else 0
