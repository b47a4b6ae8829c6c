"""``umbp-sim collect -o FILE.tar.gz [--name NAME]``: dump this host for replay elsewhere."""

from __future__ import annotations

import argparse
import sys

HELP = "dump this host's /proc and /sys (memory, hugepages, NUMA, limits) into a tarball"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="FILE.tar.gz",
        help="tarball to write (.tar, .tar.gz, .tar.bz2, .tar.xz)",
    )
    parser.add_argument("--name", help="top directory inside the tarball (default: hostname)")


def run(args: argparse.Namespace) -> int:
    from umbp_sim.collect import collect

    res = collect(args.output, args.name)
    print(
        f"wrote {res.path}: {res.name}/, {len(res.collected)} files, "
        f"{len(res.missing)} missing (listed in {res.name}/umbp-sim-collect.json)",
        file=sys.stderr,
    )
    return 0
