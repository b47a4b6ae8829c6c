"""``umbp-sim preflight [request] [--root DUMP] [--json]``: will this request get what it asks?

Reads the live host (``umbp_sim.collect`` into a temporary tarball, then the dump reader) or a
dump, and answers in simulation: nothing is allocated. Exit 0: the request gets what it asks;
1: demoted to 4 KiB pages (or its NUMA binding dropped); 2: it fails or crashes.
"""

from __future__ import annotations

import argparse
import os
import tempfile

HELP = "check a request against the live host (or --root DUMP) in simulation: exit 0/1/2"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from umbp_sim.diagnose.request import add_request_arguments

    parser.add_argument("--root", metavar="DUMP", help="a dump instead of the live host")
    add_request_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the diagnosis as JSON")


def live_host():  # type: ignore[no-untyped-def]
    """(Machine, DumpFacts) of this host, through collect and the dump reader."""
    from umbp_sim.collect import collect
    from umbp_sim.dump import load_dump

    with tempfile.TemporaryDirectory(prefix="umbp-sim-preflight-") as tmp:
        path = os.path.join(tmp, "live.tar")
        collect(path, "live")
        return load_dump(path)


def run(args: argparse.Namespace) -> int:
    from umbp_sim.commands.replay import print_diagnosis
    from umbp_sim.diagnose import diagnose
    from umbp_sim.diagnose.request import request_from_args
    from umbp_sim.dump import load_dump

    request = request_from_args(args)
    machine, facts = load_dump(args.root) if args.root else live_host()
    d = diagnose(machine, facts, request)
    print_diagnosis(d, args.json)
    return d.exit_code
