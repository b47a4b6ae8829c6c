"""``umbp-sim replay DUMP [request] [--env K=V ...] [--json]``: a field failure, replayed."""

from __future__ import annotations

import argparse

HELP = "replay a request on a dumped host: what the user saw, why, and fixes verified in simulation"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from umbp_sim.diagnose.request import add_request_arguments

    parser.add_argument("dump", help="dump directory, .tar[.gz|.bz2|.xz], or a meminfo file")
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
    from umbp_sim.diagnose import diagnose
    from umbp_sim.diagnose.request import request_from_args
    from umbp_sim.dump import load_dump

    request = request_from_args(args)  # flags first: a usage error needs no dump
    machine, facts = load_dump(args.dump)
    d = diagnose(machine, facts, request)
    from umbp_sim.diagnose.html_report import write_html

    write_html(d, args.html)  # first: an unwritable FILE fails before any output
    print_diagnosis(d, args.json)
    return 0
