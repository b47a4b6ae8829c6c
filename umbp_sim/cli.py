"""Command line: umbp-sim."""

import sys


def main(argv: list[str] | None = None) -> int:
    print("umbp-sim: no commands yet", file=sys.stderr)
    return 64
