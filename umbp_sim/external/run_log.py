"""A run's log: the allocator's stdout and stderr in the run's forked child, a pipe its server
reads while it watches the run. The server keeps the first and the last ``LOG_LIMIT / 2`` bytes
and counts what it left out between, so an allocator that prints without end costs at most
that much memory until its run's time limit, whatever it writes (a file would grow with all of
it: in memory, where the temporary directory is a tmpfs)."""

from __future__ import annotations

import os

LOG_LIMIT = 8 << 20  # bytes of a run's log kept: its head and its tail past that
_CHUNK = 1 << 16


class RunLog:
    """The pipe (``rfd`` the server's end, ``wfd`` the child's, closed here after the fork) and
    what has been read of it."""

    def __init__(self, limit: int = LOG_LIMIT) -> None:
        self.rfd, self.wfd = os.pipe2(os.O_CLOEXEC)
        self._half = limit // 2
        self._head = bytearray()
        self._tail = bytearray()  # the latest bytes past the head: at most 2 halves + a chunk
        self._total = 0

    def feed(self, data: bytes) -> None:
        """Bytes read from the pipe (``b""``: its end)."""
        self._total += len(data)
        room = self._half - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data:
            self._tail += data
            if len(self._tail) > 2 * self._half:  # trimmed now and then, not at every read
                del self._tail[: len(self._tail) - self._half]

    def drain(self, budget: int = 2 * LOG_LIMIT) -> None:
        """What is in the pipe now, without waiting: up to its end, until it is empty, or
        ``budget`` bytes (a process the run's group did not hold may go on writing)."""
        os.set_blocking(self.rfd, False)
        while budget > 0:
            try:
                data = os.read(self.rfd, min(_CHUNK, budget))
            except BlockingIOError:
                return
            self.feed(data)
            if not data:
                return
            budget -= len(data)

    def text(self) -> str:
        tail = self._tail[-self._half :] if self._half else bytearray()
        left = self._total - len(self._head) - len(tail)
        if left <= 0:
            return (self._head + tail).decode(errors="replace")
        cut = f"\n[umbp-sim: {left} bytes of the log left out]\n".encode()
        return (self._head + cut + tail).decode(errors="replace")

    def kept(self) -> int:
        """Bytes held in memory now."""
        return len(self._head) + len(self._tail)

    def close(self) -> None:
        for fd in (self.rfd, self.wfd):
            if fd >= 0:
                os.close(fd)
        self.rfd = self.wfd = -1
