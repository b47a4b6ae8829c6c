"""argparse ``type=`` functions for the command line's numbers: each value the simulator can
hold, or one line naming the problem (argparse prefixes the flag; exit 64).

    parser.add_argument("--size", type=size_flag)          # bytes, 1 .. 2**62-1, units as written
    parser.add_argument("--verify-max-size", type=cap_flag)  # size_flag, and not 0
    parser.add_argument("--numa-node", type=node_flag)     # -1 .. 2**31-1 (a C int)
    parser.add_argument("--hicache-size", type=gb_flag)    # finite GB >= 0, below 2**62 bytes
    parser.add_argument("--hicache-ratio", type=ratio_flag)
    parser.add_argument("--model-layers", type=count_flag)  # 0 .. 2**31-1
    parser.add_argument("--run-timeout", type=seconds_flag)  # seconds > 0, finite

Limits: ``umbp_sim.dump.limits`` (MAX_BYTES = 2**62: byte counts the SimKernel adds together
stay in 64 bits; MAX_INT: the C ints of node ids).
"""

from __future__ import annotations

import argparse
import math

from umbp_sim.vocabulary.units import Size, SizeError, parse_size
from umbp_sim.vocabulary.value_types import MAX_BYTES, MAX_INT

GB = 10**9


def size_flag(value: str) -> Size:
    """A byte size with its unit as written (``100GB``, ``1.5GiB``, ``4096``), below 2**62."""
    try:
        size = parse_size(value, "size")
    except SizeError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("size: ")) from None
    if size >= MAX_BYTES:
        raise argparse.ArgumentTypeError(
            f"{value.strip()[:40]} is beyond what the simulator holds (below 2^62 bytes)"
        )
    return size


def cap_flag(value: str) -> Size:
    """``size_flag`` above 0: the largest size a real allocation may have (``--verify-max-size``;
    0 would refuse every request, and was once read as the default)."""
    size = size_flag(value)
    if size == 0:
        raise argparse.ArgumentTypeError(
            f"{value.strip()[:40]} allows no allocation (the largest size --verify may allocate, "
            "above 0; default 1GiB)"
        )
    return size


def _int(value: str) -> int:
    text = value.strip()
    if len(text.lstrip("+-")) > 19:  # int() refuses 4300+ digits with a traceback-worthy error
        raise argparse.ArgumentTypeError(f"{text[:24]}... is not a usable integer")
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {shown(value)}") from None


def node_flag(value: str) -> int:
    """A NUMA node id as the allocator takes it (a C int): -1 (no binding) .. 2**31-1."""
    n = _int(value)
    if not -1 <= n <= MAX_INT:
        raise argparse.ArgumentTypeError(f"{n} is not a node (-1, or 0..{MAX_INT})")
    return n


def count_flag(value: str) -> int:
    """A model dimension or count: 0 .. 2**31-1 (what sglang's configs hold)."""
    n = _int(value)
    if not 0 <= n <= MAX_INT:
        raise argparse.ArgumentTypeError(f"{n} is outside 0..{MAX_INT}")
    return n


def _finite(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {shown(value)}") from None
    if not math.isfinite(x):
        raise argparse.ArgumentTypeError(f"{value.strip()[:20]} is not a finite number")
    if x < 0:
        raise argparse.ArgumentTypeError(f"{value.strip()[:20]} is negative")
    return x


def gb_flag(value: str) -> float:
    """sglang's ``--hicache-size``: GB (10**9 bytes) per rank, finite, below 2**62 bytes."""
    x = _finite(value)
    if x * GB >= MAX_BYTES:
        raise argparse.ArgumentTypeError(
            f"{value.strip()[:20]} GB is beyond what the simulator holds (below 2^62 bytes)"
        )
    return x


def ratio_flag(value: str) -> float:
    """sglang's ``--hicache-ratio``: a finite, non-negative factor (at most 10**6)."""
    x = _finite(value)
    if x > 1e6:
        raise argparse.ArgumentTypeError(f"{value.strip()[:20]} is beyond any host/device ratio")
    return x


def shown(value: object) -> str:
    """``umbp_sim.vocabulary.bounded.shown``, imported when an error is written (``--help`` stays
    light: tests/test_cli_imports.py)."""
    from umbp_sim.vocabulary.bounded import shown as bounded

    return bounded(value)


def seconds_flag(value: str) -> float:
    """``--run-timeout``: a positive, finite number of seconds (at most a year)."""
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value.strip()[:20]!r} is not a number of seconds"
        ) from None
    if not math.isfinite(x) or x <= 0 or x > 365 * 86400:
        raise argparse.ArgumentTypeError(
            f"{value.strip()[:20]} is not a positive number of seconds (at most a year)"
        )
    return x
