"""Progress of long work on a terminal: one line on stderr, redrawn in place, then cleared.

Quiet (writes nothing at all) unless stderr is a terminal, and also in CI (``CI`` set), with
``TERM=dumb`` or with ``UMBP_SIM_PROGRESS=0``; ``UMBP_SIM_PROGRESS=1`` forces it on. So logs,
pipes and CI output never get carriage returns. Shared by the long commands (explore, and
comparisons or fleet replays that run many simulations).

>>> import io
>>> with Progress("replaying", total=3, stream=io.StringIO()) as p:  # not a terminal: quiet
...     for name in ["a", "b", "c"]:
...         p.advance(name)
>>> p.done, p.enabled
(3, False)
>>> list(track(range(3), "scenarios", stream=io.StringIO()))
[0, 1, 2]
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TextIO, TypeVar

T = TypeVar("T")


def wanted(stream: TextIO) -> bool:
    """Whether progress should be drawn on ``stream`` (see the module docstring)."""
    forced = os.environ.get("UMBP_SIM_PROGRESS")
    if forced in ("0", "1"):
        return forced == "1"
    if os.environ.get("CI") or os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class Progress:
    """``label done/total detail`` on one line of ``stream`` (stderr), at most every
    ``interval`` seconds; ``close()`` (or leaving the ``with`` block) erases it."""

    def __init__(
        self,
        label: str,
        total: int | None = None,
        stream: TextIO | None = None,
        interval: float = 0.1,
    ) -> None:
        self.label = label
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.interval = interval
        self.enabled = wanted(self.stream)
        self.done = 0
        self._last = 0.0
        self._width = 0

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def advance(self, detail: str = "", n: int = 1) -> None:
        """Count ``n`` more items done; redraw if the last draw is ``interval`` old."""
        self.done += n
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < self.interval and self.done != self.total:
            return
        self._last = now
        count = f"{self.done}/{self.total}" if self.total is not None else str(self.done)
        line = f"{self.label} {count} {detail}".rstrip()[:120]
        self.stream.write("\r" + line.ljust(self._width))
        self.stream.flush()
        self._width = len(line)

    def close(self) -> None:
        """Erase the line (nothing was drawn when disabled)."""
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0


def track(
    items: Iterable[T], label: str, total: int | None = None, stream: TextIO | None = None
) -> Iterator[T]:
    """Yield ``items``, counting each one on a :class:`Progress` line."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with Progress(label, total, stream) as p:
        for item in items:
            yield item
            p.advance()
