"""The stable id of an allocator warning (csrc/allocator/warning_texts.h).

The built-in allocators log each warning with its id (the LogRecord attribute ``warning_id``).
An external build (mori's own code, built with ``umbp-sim build-allocator``) prints only text:
:func:`warning_id` finds the id of such a line by matching it against the templates of the
catalogues, mori's MORI_UMBP_WARN lines first. This is the one place a warning's prose is
matched; explanations select warnings by id.
"""

from __future__ import annotations

import functools
import re


@functools.cache
def _patterns() -> tuple[tuple[str, re.Pattern[str]], ...]:
    import umbp_sim._native as _native  # the catalogue is the native one, declared once

    entries = sorted(_native.warning_catalogue(), key=lambda e: e[0] != "mori")
    out = []
    for _, wid, template in entries:
        parts = re.split(r"\{[a-z_]+\}", template)
        out.append((wid, re.compile("(?s)" + ".*".join(re.escape(p) for p in parts))))
    return tuple(out)


def warning_id(text: str) -> str | None:
    """The id of the catalogue warning ``text`` is (its placeholders filled), else None."""
    for wid, pattern in _patterns():
        if pattern.fullmatch(text):
            return wid
    return None


def warning_id_in(line: str, among: frozenset[str] | None = None) -> str | None:
    """The id of the catalogue warning (of the ids ``among``, default any) found in ``line`` (a
    log line: a timestamp, a level or a logger's name before it), else None."""
    for wid, pattern in _patterns():
        if (among is None or wid in among) and pattern.search(line):
            return wid
    return None
