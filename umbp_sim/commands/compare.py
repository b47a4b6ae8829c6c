"""umbp-sim compare SPEC_A SPEC_B: the regression suite for an allocator change.

Both allocators run the bundled scenarios (one-alloc requests) and a request matrix, each run on
a fresh simulated host (an external build in a fresh process); the differences are grouped by
class. Exit 0: no difference, 1: differences, 2: an allocator could not run.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from collections.abc import Callable

from umbp_sim.allocator_spec import parse_allocator_spec
from umbp_sim.external import matrix
from umbp_sim.external.compare import compare
from umbp_sim.external.runner import CouldNotRun, open_allocator

HELP = "run two allocators (built-in profile, module or built .so) over the same runs; diff them"

EX_DIFFERENT = 1
EX_COULD_NOT_RUN = 2


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


def _progress(total: int) -> Callable[[int], None] | None:
    if not sys.stderr.isatty():
        return None

    def show(i: int) -> None:
        width = 30
        done = width * i // max(total, 1)
        end = "\n" if i == total else ""
        sys.stderr.write(f"\r[{'#' * done}{' ' * (width - done)}] {i}/{total}{end}")
        sys.stderr.flush()

    return show


def run(args: argparse.Namespace) -> int:
    spec_a = parse_allocator_spec(args.spec_a)
    spec_b = parse_allocator_spec(args.spec_b)
    runs = [] if args.no_scenarios else list(matrix.scenario_runs())
    if args.matrix == "quick":
        runs += list(matrix.quick())
    elif args.matrix == "full":
        runs += list(matrix.full())
    runs = list({r.label: r for r in runs}.values())  # the matrix's groups overlap
    if args.pattern:
        glob = args.pattern if any(c in args.pattern for c in "*?[") else f"*{args.pattern}*"
        runs = [r for r in runs if fnmatch.fnmatch(r.label, glob)]
    opened = []
    try:
        try:
            for spec in (spec_a, spec_b):
                opened.append(open_allocator(spec))
            result = compare(opened[0], opened[1], runs, _progress(len(runs)))
        except CouldNotRun as e:
            print(f"umbp-sim compare: {e}", file=sys.stderr)
            return EX_COULD_NOT_RUN
    finally:
        for r in opened:
            r.close()
    if args.json:
        json.dump(result.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(result.report(args.examples))
    return 0 if result.same else EX_DIFFERENT
