"""Byte sizes as people write them: ``4096``, ``64MiB``, ``2GiB``, ``4TiB``, ``2048kB``."""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tb": 1 << 40,
    "tib": 1 << 40,
    "p": 1 << 50,
    "pib": 1 << 50,
}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([A-Za-z]*)\s*$")


class SizeError(ValueError):
    """A size that cannot be read; the message names the value."""


def parse_size(value: int | str, what: str = "size") -> int:
    """Bytes from an int or a string with a binary unit (kB in /proc means KiB, as the kernel does).

    Raises SizeError naming ``what`` and the value for anything else, including negatives.
    """
    if isinstance(value, bool):
        raise SizeError(f"{what}: expected a size, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise SizeError(f"{what}: size must not be negative, got {value}")
        return value
    if not isinstance(value, str):
        raise SizeError(f"{what}: expected a size such as 4096 or '2MiB', got {value!r}")
    m = _SIZE_RE.match(value)
    if not m or m.group(2).lower() not in _UNITS:
        raise SizeError(
            f"{what}: cannot read size {value!r} (use bytes or a unit: kB, KiB, MiB, GiB, TiB)"
        )
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def format_size(n: int) -> str:
    """Shortest exact binary-unit spelling: 2097152 -> '2MiB', 4096 -> '4KiB', 1000 -> '1000B'."""
    for unit, mult in (
        ("PiB", 1 << 50),
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ):
        if n >= mult and n % mult == 0:
            return f"{n // mult}{unit}"
    return f"{n}B"
