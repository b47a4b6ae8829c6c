"""``umbp-sim replay DUMP [request] [--env K=V ...] [--json]``: a field failure, replayed."""

from __future__ import annotations

import argparse

HELP = "replay a request on a dumped host: what the user saw, why, and fixes verified in simulation"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from umbp_sim.diagnose.request import add_request_arguments

    parser.add_argument(
        "dump",
        nargs="+",
        metavar="DUMP|DIR|GLOB",
        help="dump directory, .tar[.gz|.bz2|.xz], or a meminfo file; several, a directory of "
        "dumps or a glob: a row per host (umbp_sim/diagnose/fleet.py)",
    )
    add_request_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    parser.add_argument("--html", metavar="FILE", help="also write the report as an HTML page")


def print_diagnosis(d, as_json: bool) -> None:  # type: ignore[no-untyped-def]
    from umbp_sim.diagnose.report import render_json, render_text

    print(render_json(d) if as_json else render_text(d))
    if not as_json:
        from umbp_sim.diagnose.picture import bars_for

        print(bars_for(d), end="")


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    finally:
        close_external_allocators()


def close_external_allocators() -> None:
    """End the server process of an external ``--allocator`` (one per command), if one ran."""
    import sys

    if "umbp_sim.external.observe" in sys.modules:
        sys.modules["umbp_sim.external.observe"].close_runners()


def _run(args: argparse.Namespace) -> int:
    from umbp_sim.diagnose import diagnose
    from umbp_sim.diagnose.fleet import is_fleet
    from umbp_sim.diagnose.request import request_from_args
    from umbp_sim.dump import load_dump

    request = request_from_args(args)  # flags first: a usage error needs no dump
    if is_fleet(args.dump):
        return replay_fleet_command(args.dump, request, args.json)
    machine, facts = load_dump(args.dump[0])
    d = diagnose(machine, facts, request)
    from umbp_sim.diagnose.html_report import write_html

    write_html(d, args.html)  # first: an unwritable FILE fails before any output
    print_diagnosis(d, args.json)
    return 0


def replay_fleet_command(args: list[str], request, as_json: bool) -> int:  # type: ignore[no-untyped-def]
    import json

    from umbp_sim.diagnose.fleet import (
        expand_dumps,
        render_fleet_text,
        replay_fleet,
        tty_progress,
    )

    report = replay_fleet(expand_dumps(args), request, progress=tty_progress())
    print(json.dumps(report.to_json(), indent=1) if as_json else render_fleet_text(report))
    return report.exit_code
