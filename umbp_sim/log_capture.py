"""One handler that keeps what a run logged: every text, and which logger said it."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


class LogCapture(logging.Handler):
    """Records at ``level`` and above: ``messages`` (the texts, in order) and ``log``
    ((logger name, text) pairs); ``of(name)`` is one logger's texts."""

    def __init__(self, level: int = logging.WARNING) -> None:
        super().__init__(level)
        self.messages: list[str] = []
        self.log: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        self.messages.append(text)
        self.log.append((record.name, text))

    def of(self, name: str) -> list[str]:
        """The texts logger ``name`` logged."""
        return [text for logger, text in self.log if logger == name]


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
