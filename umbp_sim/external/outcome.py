"""What an external allocator's process printed, read back: its warning lines, and the
interposer's crash report (signal and detail, the syscall trace)."""

from __future__ import annotations

import re

__all__ = ["warning_lines"]


_LOG_PREFIX = re.compile(r"^(\[[^\]]*\]\s*)+")
_WARNING = re.compile(r"\bwarn(ing)?\b", re.IGNORECASE)


def warning_lines(text: str) -> list[str]:
    """Warnings in an allocator's log (stderr): lines that say warn/warning, prefixes removed
    (spdlog's ``[time] [pid] [umbp] [warning]``). The log is the allocator's alone: umbp-sim's
    evidence of a run comes on pipes of its own (``umbp_sim.external.evidence``)."""
    out = []
    for line in text.splitlines():
        if not _WARNING.search(line):
            continue
        line = _LOG_PREFIX.sub("", line.strip())
        line = re.sub(r"^\w+ \[warning\]\s*", "", line)
        out.append(line)
    return out
