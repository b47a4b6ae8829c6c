"""umbp-sim compare SPEC_A SPEC_B: the regression suite for an allocator change.

Both allocators run the bundled scenarios (one-alloc and steps requests: the shm registry's steps
where both have it) and a request matrix, each run on
a fresh simulated host (an external build in a fresh process); the differences are grouped by
class. ``--jobs N`` spreads the runs over N worker processes (umbp_sim/comparison/parallel.py; the
result is the serial one, byte for byte). Each run of an external build, and its import, is
bounded by ``--run-timeout`` (a run past it is the outcome "timed out after N s in STAGE"; the
next run goes on). Exit 0: no difference, 1: differences, 2: an allocator could not run (or a
worker died, or Ctrl-C), 143/129: SIGTERM/SIGHUP (every worker and server ended first).
``--html FILE`` also writes the differences as a page (umbp_sim/comparison/report_html.py).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import sys
from typing import TYPE_CHECKING, Any

from umbp_sim.vocabulary.exit_codes import EX_FAILS, EX_NEGATIVE, EX_USAGE

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from umbp_sim.comparison.differences import Compared

EX_DIFFERENT = EX_NEGATIVE
EX_COULD_NOT_RUN = EX_FAILS  # compare's own meaning of 2


def add_arguments(p: argparse.ArgumentParser) -> None:
    from umbp_sim.vocabulary.flag_types import seconds_flag

    p.epilog = (
        "Classes of difference: outcome, backing, requested_size, mapped_size, alignment, handle "
        "(every other field of the handle alloc returned: numa_node, fd, ...; all of an invalid "
        "one's), numa binding (the policy on the buffer's VMA and the nodes its hugepages came "
        "from), faulted "
        "(the buffer's pages faulted when alloc returned, by page size), mapping (its VMA: shared "
        "or private, anonymous or a file, protection, noreserve/populate, page size), crash, "
        "leak, after free (every field of the handle as the first of a run's two frees left "
        "it), registry (what mori's shm registry says of the buffer after alloc and after its "
        "free), steps (what each step of a steps scenario came to), warning count, warning "
        "text, log level (the same lines at another level: warning, error, critical); a "
        "run of an external build past --run-timeout differs in outcome (timed out after N s "
        "in alloc); 3 runs in a row of one allocator timed out in the same stage stop compare "
        "(exit 2) unless --keep-going. Exit status: 0 no difference, 1 differences, 2 could "
        "not run (an allocator failed to load, a worker died, Ctrl-C, runs in a row timed "
        "out), 64 bad usage or nothing to compare, 143/129 SIGTERM/SIGHUP."
    )
    p.add_argument("spec_a", metavar="SPEC_A", nargs="?",
                   help="umbp-sim | mori | MODULE | PATH.so")  # fmt: skip
    p.add_argument("spec_b", metavar="SPEC_B", nargs="?",
                   help="umbp-sim | mori | MODULE | PATH.so")  # fmt: skip
    p.add_argument(
        "--shard", metavar="K/N",
        help="only the K-th of N shares of the runs (after -k): run each share on its own "
        "machine with --json, then --merge the files",
    )  # fmt: skip
    p.add_argument(
        "--merge", nargs="+", metavar="SHARD.json",
        help="the comparison the shards' JSON files (--shard K/N --json, every K once) make "
        "together, as one run would print it (no SPEC_A/SPEC_B, no runs)",
    )  # fmt: skip
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
    p.add_argument(
        "--junit", metavar="FILE",
        help="also write the comparison as JUnit XML: one test case per class of difference, "
        "failing with every run that differs in it",
    )  # fmt: skip
    p.add_argument(
        "--jobs", "-j", type=int, default=None, metavar="N",
        help="worker processes (default: the number of CPUs; 1: every run in this process, "
        "one after the other); the result is the same for any N",
    )  # fmt: skip
    p.add_argument(
        "--run-timeout", type=seconds_flag, default=None, metavar="SECONDS",
        help="the time limit of each run of an external build and of its import (default 60): "
        "a run past it is the outcome 'timed out after N s in STAGE', the next run goes on",
    )  # fmt: skip
    p.add_argument(
        "--keep-going", action="store_true",
        help="run every run even when 3 runs in a row of one allocator timed out in the same "
        "stage (by default compare stops there, exit 2: an allocator that hangs in every alloc "
        "would cost --run-timeout per run)",
    )  # fmt: skip
    p.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE",
        help="set in an external allocator's process for every run; repeatable. External "
        "allocators run with MORI_UMBP_LOG_LEVEL=warn unless --env or the environment sets "
        "MORI_UMBP_LOG_LEVEL or MORI_GLOBAL_LOG_LEVEL (at mori's default level, error, its "
        "warnings are not printed; the built-in allocator's warnings are always collected)",
    )  # fmt: skip


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _UsageError(Exception):
    pass


def _env(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not _ENV_NAME.fullmatch(name):
            raise _UsageError(f"--env {pair!r}: expected NAME=VALUE")
        out[name] = value
    return out


def _recorded(
    items: Iterable[Compared], lines_a: dict[str, str], lines_b: dict[str, str]
) -> Iterator[Compared]:
    """``items``, keeping each run's outcome in one line per allocator (for --html)."""
    for item in items:
        lines_a[item[0].label], lines_b[item[0].label] = item[2], item[3]
        yield item


def run(args: argparse.Namespace) -> int:
    from umbp_sim.external.procs import ended_by_signals

    if args.merge is not None:
        return _merge(args)
    if args.spec_a is None or args.spec_b is None:
        print("umbp-sim compare: give SPEC_A and SPEC_B (or --merge SHARD.json ...)",
              file=sys.stderr)  # fmt: skip
        return EX_USAGE
    with ended_by_signals():
        return _run(args)


def _merge(args: argparse.Namespace) -> int:
    """``compare --merge SHARD.json ...``: the shards' comparison, as one run prints it."""
    from umbp_sim.comparison.shards import merge, read_paths

    clash = [flag for flag, given in (("SPEC_A/SPEC_B", args.spec_a is not None),
                                      ("--shard", args.shard is not None),
                                      ("--html", args.html is not None)) if given]  # fmt: skip
    if clash:
        why = "the shards were run; --html needs each run's outcome: write it on one machine"
        print(f"umbp-sim compare: --merge takes no {', '.join(clash)} ({why})", file=sys.stderr)
        return EX_USAGE
    junit = None
    if args.junit:
        from umbp_sim.html_page import PageFile

        junit = PageFile(args.junit, "--junit")
    try:
        result = merge(read_paths(args.merge))
        if junit is not None:
            from umbp_sim.comparison.report_junit import render_junit

            junit.write(render_junit(result))
    finally:
        if junit is not None and not junit.written:
            junit.discard()
    _print(result, args)
    return 0 if result.same else EX_DIFFERENT


def _print(result: Any, args: argparse.Namespace) -> None:
    if args.json:
        json.dump(result.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(result.report(args.examples))


def _run(args: argparse.Namespace) -> int:
    from umbp_sim.allocator_profiles import with_mori_warnings
    from umbp_sim.allocator_spec import parse_allocator_spec
    from umbp_sim.comparison import matrix
    from umbp_sim.comparison.differences import (
        compare_differences,
        serial_differences,
        stop_when_stalled,
    )
    from umbp_sim.comparison.parallel import parallel_differences
    from umbp_sim.errors import Terminated
    from umbp_sim.external.runner import DEFAULT_RUN_TIMEOUT, CouldNotRun
    from umbp_sim.progress import Progress
    from umbp_sim.run_router import open_allocator

    spec_a = parse_allocator_spec(args.spec_a, "SPEC_A")
    spec_b = parse_allocator_spec(args.spec_b, "SPEC_B")
    try:
        env = with_mori_warnings(_env(args.env), os.environ)
        jobs = (os.cpu_count() or 1) if args.jobs is None else args.jobs
        if jobs < 1:
            raise _UsageError(f"--jobs {args.jobs}: must be at least 1")
    except _UsageError as e:
        print(f"umbp-sim compare: {e}", file=sys.stderr)
        return EX_USAGE
    if args.no_scenarios:
        runs = []
    else:  # steps that acquire, look up or release where both allocators have the registry
        from umbp_sim.external.observe import has_registry

        limit = args.run_timeout or DEFAULT_RUN_TIMEOUT
        try:
            both = has_registry(spec_a, limit) and has_registry(spec_b, limit)
        except CouldNotRun as e:  # an import past --run-timeout: once, not again per run
            print(f"umbp-sim compare: {e}", file=sys.stderr)
            return EX_COULD_NOT_RUN
        runs = list(matrix.scenario_runs(both))
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
    shard = None
    if args.shard is not None:
        from umbp_sim.comparison import shards

        k, n = shards.parse_shard(args.shard)
        labels = [r.label for r in runs]
        shard, index = shards.shard_info(k, n, labels), {lb: i for i, lb in enumerate(labels)}
        runs = shards.select(runs, k, n)
        jobs = jobs if runs else 1  # a share with no run (N above the runs): nothing to spread
    page = junit = None
    if args.html or args.junit:  # before the runs: an unwritable FILE fails at once
        from umbp_sim.html_page import PageFile

        page = PageFile(args.html) if args.html else None
        junit = PageFile(args.junit, "--junit") if args.junit else None
    opened: list[Any] = []
    lines_a: dict[str, str] = {}
    lines_b: dict[str, str] = {}
    progress = Progress("compare: runs", total=len(runs))
    timeout = args.run_timeout or DEFAULT_RUN_TIMEOUT
    outcomes: Any = None
    try:
        with progress:
            if jobs == 1:
                for spec in (spec_a, spec_b):
                    opened.append(open_allocator(spec, env, timeout))
                outcomes = serial_differences(opened[0], opened[1], runs)
                count: Any = lambda _i: progress.advance()  # noqa: E731
            else:
                outcomes = parallel_differences(
                    spec_a, spec_b, runs, jobs, env, progress.advance, timeout
                )
                count = None
            if not args.keep_going:
                names = (str(spec_a), str(spec_b))
                outcomes = stop_when_stalled(outcomes, names, len(runs), timeout)
            if page is not None:
                outcomes = _recorded(outcomes, lines_a, lines_b)
            result = compare_differences(str(spec_a), str(spec_b), outcomes, count)
            if shard is not None:
                result.shard, result.index = shard, index
        if page is not None:
            from umbp_sim.comparison.report_html import render_compare_html

            page.write(render_compare_html(result, lines_a, lines_b))
        if junit is not None:
            from umbp_sim.comparison.report_junit import render_junit

            junit.write(render_junit(result))
    except CouldNotRun as e:
        print(f"umbp-sim compare: {e}", file=sys.stderr)
        return EX_COULD_NOT_RUN
    except KeyboardInterrupt:
        print(
            f"umbp-sim compare: interrupted after {progress.done} of {len(runs)} runs "
            "(nothing compared)",
            file=sys.stderr,
        )
        return EX_COULD_NOT_RUN
    except Terminated as e:
        print(
            f"umbp-sim compare: {e} after {progress.done} of {len(runs)} runs (nothing compared)",
            file=sys.stderr,
        )
        return e.exit_code
    finally:
        if outcomes is not None:
            outcomes.close()  # the workers end here, even when the comparison stopped early
        for r in opened:
            r.close()
        for out in (page, junit):
            if out is not None and not out.written:
                out.discard()  # no page (nor an empty file) left behind
    _print(result, args)
    return 0 if result.same else EX_DIFFERENT
