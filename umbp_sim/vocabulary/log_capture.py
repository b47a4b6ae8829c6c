"""One handler that keeps what a run logged: every text, which logger said it and, for the
built-in allocators' warnings, the warning's stable id (the LogRecord attribute ``warning_id``;
csrc/allocator/warning_texts.h)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

# (logger name, warning id or None, text)
LogEntry = tuple[str, "str | None", str]


class LogCapture(logging.Handler):
    """Records at ``level`` and above: ``messages`` (the texts, in order) and ``log``
    ((logger name, warning id, text) triples); ``of(name)`` is one logger's texts."""

    def __init__(self, level: int = logging.WARNING) -> None:
        super().__init__(level)
        self.messages: list[str] = []
        self.log: list[LogEntry] = []
        self.levels: list[str] = []  # each entry's level name, lower case ("warning")

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        self.messages.append(text)
        self.log.append((record.name, getattr(record, "warning_id", None), text))
        self.levels.append(record.levelname.lower())

    def of(self, name: str) -> list[str]:
        """The texts logger ``name`` logged."""
        return [text for logger, _, text in self.log if logger == name]

    def levels_of(self, name: str) -> list[str]:
        """The level of each text logger ``name`` logged (``of``'s order)."""
        return [
            lv for (logger, _, _), lv in zip(self.log, self.levels, strict=True) if logger == name
        ]


@contextmanager
def capture_logs(
    names: tuple[str, ...] | list[str], level: int = logging.WARNING
) -> Iterator[LogCapture]:
    """A LogCapture on the loggers ``names`` for the block."""
    handler = LogCapture(level)
    loggers = [logging.getLogger(n) for n in names]
    for log in loggers:
        log.addHandler(handler)
    try:
        yield handler
    finally:
        for log in loggers:
            log.removeHandler(handler)
