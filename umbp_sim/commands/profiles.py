"""``umbp-sim profiles``: the built-in allocator's profiles and where they differ."""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="every decision point of every profile")


def run(args: argparse.Namespace) -> int:
    from umbp_sim.profiles import difference_table, policies

    if args.json:
        print(json.dumps(policies(), indent=2))
    else:
        print(difference_table())
    return 0
