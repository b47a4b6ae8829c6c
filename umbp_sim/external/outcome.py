"""What an external allocator's process printed, read back: its warning lines, and the
interposer's crash report (signal and detail, the syscall trace)."""

from __future__ import annotations

import re

__all__ = ["log_lines", "warning_lines"]


_LOG_PREFIX = re.compile(r"^(\[[^\]]*\]\s*)+")
_WARNING = re.compile(r"\bwarn(ing)?\b", re.IGNORECASE)
# spdlog's level names (and Python's), as a line's [level] field gives them
_LEVEL = re.compile(r"\[(trace|debug|info|warn|warning|error|err|critical)\]", re.IGNORECASE)
_LEVEL_NAMES = {"warn": "warning", "err": "error"}
SHOWN_LEVELS = ("warning", "error", "critical")


def log_lines(text: str) -> list[tuple[str, str]]:
    """(level, text) of each line of an allocator's log (stderr) at warning or above: a line
    whose ``[level]`` field says so (spdlog's ``[time] [pid] [umbp] [warning]``, or ``name
    [error]``), or that has none and says warn/warning; prefixes removed. The log is the
    allocator's alone: umbp-sim's evidence of a run comes on pipes of its own
    (``umbp_sim.external.evidence``)."""
    out = []
    for line in text.splitlines():
        m = _LEVEL.search(line)
        if m is not None:
            level = _LEVEL_NAMES.get(m[1].lower(), m[1].lower())
            if level not in SHOWN_LEVELS:
                continue
        elif _WARNING.search(line):
            level = "warning"
        else:
            continue
        line = _LOG_PREFIX.sub("", line.strip())
        line = re.sub(r"^\w+ \[\w+\]\s*", "", line)
        out.append((level, line))
    return out


def warning_lines(text: str) -> list[str]:
    """The texts of ``log_lines``."""
    return [line for _level, line in log_lines(text)]
