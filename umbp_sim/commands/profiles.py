"""``umbp-sim profiles``: the built-in allocators' profiles and where they differ."""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--json",
        action="store_true",
        help="every difference as {decision, umbp_sim, mori, mori_lines}",
    )


def run(args: argparse.Namespace) -> int:
    from umbp_sim.allocator_profiles import difference_table, differences

    if args.json:
        print(json.dumps(differences(), indent=2))
    else:
        print(difference_table())
    return 0
