"""umbp-sim compare SPEC_A SPEC_B: the regression suite for an allocator change.

Both allocators run the bundled scenarios (one-alloc requests) and a request matrix, each run on
a fresh simulated host (an external build in a fresh process); the differences are grouped by
class. Exit 0: no difference, 1: differences, 2: an allocator could not run. ``--html FILE``
also writes the differences as a page (umbp_sim/external/compare_html.py).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from umbp_sim.external.outcome import Outcome, Run

EX_DIFFERENT = 1
EX_COULD_NOT_RUN = 2
EX_USAGE = 64


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec_a", metavar="SPEC_A", help="umbp-sim | mori | MODULE | PATH.so")
    p.add_argument("spec_b", metavar="SPEC_B", help="umbp-sim | mori | MODULE | PATH.so")
    p.add_argument(
        "--matrix", choices=("quick", "full", "none"), default="quick",
        help="request matrix: quick (default), full (the whole product: long), none",
    )  # fmt: skip
    p.add_argument("--no-scenarios", action="store_true", help="skip the bundled scenarios")
    p.add_argument("-k", dest="pattern", help="only runs whose label matches (glob)")
    p.add_argument("--json", action="store_true", help="one JSON document instead of a report")
    p.add_argument("--examples", type=int, default=5, help="runs shown per class (default 5)")
    p.add_argument(
        "--html", metavar="FILE",
        help="also write the differences as an HTML page (every differing run, by class)",
    )  # fmt: skip


class _Recording:
    """An allocator runner that also keeps each run's outcome in one line (for --html)."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.spec = runner.spec
        self.outcomes: dict[str, str] = {}
        from umbp_sim.external.compare_html import outcome_line

        self._line = outcome_line

    def run(self, run: Run) -> Outcome:
        outcome = self.runner.run(run)
        self.outcomes[run.label] = self._line(outcome)
        return outcome


def run(args: argparse.Namespace) -> int:
    from umbp_sim.allocator_spec import parse_allocator_spec
    from umbp_sim.external import matrix
    from umbp_sim.external.compare import compare
    from umbp_sim.external.runner import CouldNotRun, open_allocator
    from umbp_sim.progress import Progress

    spec_a = parse_allocator_spec(args.spec_a, "SPEC_A")
    spec_b = parse_allocator_spec(args.spec_b, "SPEC_B")
    runs = [] if args.no_scenarios else list(matrix.scenario_runs())
    if args.matrix == "quick":
        runs += list(matrix.quick())
    elif args.matrix == "full":
        runs += list(matrix.full())
    runs = list({r.label: r for r in runs}.values())  # the matrix's groups overlap
    if args.pattern:
        glob = args.pattern if any(c in args.pattern for c in "*?[") else f"*{args.pattern}*"
        runs = [r for r in runs if fnmatch.fnmatch(r.label, glob)]
    if not runs:  # a regression check that ran nothing must not pass
        what = f"-k {args.pattern!r}: no run's label matches" if args.pattern else "no runs"
        print(f"umbp-sim compare: {what} (nothing compared)", file=sys.stderr)
        return EX_USAGE
    page = None
    if args.html:
        from umbp_sim.diagnose.html_report import PageFile

        page = PageFile(args.html)  # before the runs: an unwritable FILE fails at once
    opened: list[Any] = []
    try:
        for spec in (spec_a, spec_b):
            opened.append(open_allocator(spec))
        runners: list[Any] = opened if page is None else [_Recording(r) for r in opened]
        a, b = runners
        with Progress("compare: runs", total=len(runs)) as progress:
            result = compare(a, b, runs, lambda _i: progress.advance())
        if page is not None:
            from umbp_sim.external.compare_html import render_compare_html

            page.write(render_compare_html(result, a.outcomes, b.outcomes))
    except CouldNotRun as e:
        print(f"umbp-sim compare: {e}", file=sys.stderr)
        return EX_COULD_NOT_RUN
    finally:
        for r in opened:
            r.close()
        if page is not None and not page.written:
            page.discard()  # no page (nor an empty file) left behind
    if args.json:
        json.dump(result.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(result.report(args.examples))
    return 0 if result.same else EX_DIFFERENT
