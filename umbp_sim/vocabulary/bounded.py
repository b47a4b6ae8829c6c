"""Values in error messages, bounded: :func:`shown` (``repr`` in at most about 80 characters,
whatever the value), :func:`shown_path` (a path in full up to PATH_MAX) and :func:`short_list`
(the first items, then a count). Every input a user gives may be hostile (a 10 MB string, an
integer of 5,000 digits); every message that quotes one goes through here.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Callable, Iterable
from typing import Any


def _digits(n: int) -> str:
    """``a 5000-digit integer`` without converting it (int() stops at 4,300 digits)."""
    bits = abs(n).bit_length()
    count = len(str(abs(n))) if bits < 4000 else int(bits * math.log10(2)) + 1
    sign = "a negative " if n < 0 else "a "
    return f"{sign}{count}-digit integer"


class _Shown(reprlib.Repr):
    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 2
        self.maxlist = self.maxtuple = self.maxset = 4
        self.maxdict = 3
        self.maxstring = 40
        self.maxother = 40

    def repr_int(self, x: int, level: int) -> str:
        return repr(x) if abs(x) < 10**24 else _digits(x)

    def repr_str(self, x: str, level: int) -> str:
        if len(x) <= self.maxstring:
            return repr(x)
        return repr(x[: self.maxstring]) + f"... ({len(x)} characters)"


_SHOWN = _Shown()


def shown(value: Any) -> str:
    """``repr(value)`` in at most about 80 characters, whatever the value (a 10 MB string, a
    list of a million items, an integer of 5,000 digits, arrays nested 500 deep)."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):  # a Size too (an int that remembers its unit)
        return _SHOWN.repr_int(int(value), 0)
    return _SHOWN.repr(value)


def shown_path(text: str) -> str:
    """A path as written (``repr``), in full up to PATH_MAX: a user must be able to read which
    file was meant; anything longer is no path and is :func:`shown` bounded."""
    return repr(text) if len(text) <= 4096 else shown(text)


def short_list(
    items: Iterable[Any],
    limit: int = 8,
    show: Callable[[Any], str] | None = None,
    sep: str = ", ",
) -> str:
    """``0, 1, 2, 3, 4, 5, 6, 7, ... (999,992 more)``: the first ``limit`` items (each through
    ``show``, default :func:`shown`) joined by ``sep``, then a count."""
    out: list[str] = []
    more = 0
    for item in items:
        if len(out) < limit:
            out.append((show or shown)(item))
        else:
            more += 1
    return sep.join(out) + (f"{sep}... ({more:,} more)" if more else "")


__all__ = ["short_list", "shown", "shown_path"]
