"""``umbp-sim replay DUMP [request] [--env K=V ...] [--json]``: a field failure, replayed."""

from __future__ import annotations

import argparse

HELP = "replay a request on a dumped host: what the user saw, why, and fixes verified in simulation"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from umbp_sim.diagnose.request import add_request_arguments

    parser.add_argument("dump", help="dump directory, .tar[.gz|.bz2|.xz], or a meminfo file")
    add_request_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the diagnosis as JSON")


def print_diagnosis(d, as_json: bool) -> None:  # type: ignore[no-untyped-def]
    from umbp_sim.diagnose.report import render_json, render_text

    print(render_json(d) if as_json else render_text(d))


def run(args: argparse.Namespace) -> int:
    from umbp_sim.diagnose import diagnose
    from umbp_sim.diagnose.request import request_from_args
    from umbp_sim.dump import load_dump

    request = request_from_args(args)  # flags first: a usage error needs no dump
    machine, facts = load_dump(args.dump)
    print_diagnosis(diagnose(machine, facts, request), args.json)
    return 0
