"""The one tokenizer of ``/proc/meminfo`` and ``nodeN/meminfo`` lines.

The kernel writes ``Key:   value[ kB]`` (``Node N Key: value kB`` per node). This module only
cuts lines into their parts; what a view accepts, its unit and its error text stay with the view:

- ``umbp_sim.dump.parse.parse_meminfo``: strict, the keys umbp-sim uses, kB in **bytes**,
  ``DumpError``;
- ``umbp_sim.sglang.sizing.parse_meminfo``: every key, in the file's unit (kB, or a count),
  ``SizingError`` (psutil reads it the same way);
- ``umbp_sim.sim.SimHost.meminfo``: a file SimKernel rendered, in the file's unit, trusted.

It imports nothing of umbp-sim, so the sglang sizing and the simulator do not load the dump
package to read one file.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple


class MeminfoLine(NamedTuple):
    """One non-blank line: its 1-based number, the line as written, and its parts."""

    lineno: int
    raw: str
    key: str  # the text before the first ':' (the whole line when there is none)
    has_colon: bool
    value: str  # the text after the first ':' ("" when there is none)


def split_lines(text: str) -> list[str]:
    """The lines as the kernel ends them: every one with "\\n"; a last line without it (a
    truncated file) is still a line."""
    return text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")


def meminfo_lines(lines: Iterable[str]) -> Iterator[MeminfoLine]:
    """Each non-blank line of ``lines`` cut at its first ':'."""
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        key, colon, value = raw.partition(":")
        yield MeminfoLine(n, raw, key, bool(colon), value)


def file_units(text: str) -> dict[str, int]:
    """A meminfo file the simulator rendered: {key: the number as printed (kB or a count)}."""
    return {t.key: int(t.value.split()[0]) for t in meminfo_lines(text.splitlines())}
