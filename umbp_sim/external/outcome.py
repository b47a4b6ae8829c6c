"""What an external allocator's process printed, read back: its warning lines, and the
interposer's crash report (signal and detail, the syscall trace)."""

from __future__ import annotations

import re

__all__ = ["crash_report", "trace_from_report", "warning_lines"]


_LOG_PREFIX = re.compile(r"^(\[[^\]]*\]\s*)+")
_WARNING = re.compile(r"\bwarn(ing)?\b", re.IGNORECASE)


def warning_lines(text: str) -> list[str]:
    """Warnings in an allocator's log (stderr): lines that say warn/warning, prefixes removed
    (spdlog's ``[time] [pid] [umbp] [warning]``); umbp-sim's own crash report is not one."""
    out = []
    in_report = False  # the reasons and the trace of a crash report are not the allocator's
    for line in text.splitlines():
        if line in ("umbp-sim: reasons:", "umbp-sim: syscall trace:"):
            in_report = True
        elif line.startswith(("umbp-sim: end of reasons", "umbp-sim: end of trace")):
            in_report = False
            continue
        if in_report or line.startswith("umbp-sim:") or not _WARNING.search(line):
            continue
        line = _LOG_PREFIX.sub("", line.strip())
        line = re.sub(r"^\w+ \[warning\]\s*", "", line)
        out.append(line)
    return out


_CRASH = re.compile(r"^umbp-sim: simulated (SIG\w+|a signal) \(([^)]*)\): (.*)$", re.MULTILINE)


def crash_report(text: str) -> tuple[str | None, str]:
    """(signal, detail) from the interposer's crash report in a child's stderr, if any."""
    m = _CRASH.search(text)
    if not m:
        return None, ""
    return m.group(1), m.group(3)


def trace_from_report(text: str) -> list[str]:
    """The syscall trace the interposer printed before the process died."""
    start = text.find("umbp-sim: syscall trace:\n")
    if start < 0:
        return []
    body = text[start + len("umbp-sim: syscall trace:\n") :]
    end = body.find("umbp-sim: end of trace")
    return [ln for ln in (body if end < 0 else body[:end]).splitlines() if ln]
