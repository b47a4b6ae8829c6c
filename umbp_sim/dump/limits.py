"""Bounds on the work any dump may cost, and the one-line error when one is crossed.

A dump comes from a machine the user cannot reach, so it is untrusted input: a 2 MB tarball
must not be able to ask for gigabytes of memory or minutes of CPU. Every bound below is checked
while reading, before the work it guards is done; crossing one is a ``DumpLimitError`` (exit 65)
whose message names the limit::

    host.tar.bz2: over the unpacked-size limit: more than 536870912 bytes after decompression

The defaults leave room for the largest real dumps seen (hwloc-gather-topology of a 128-CPU
arm64 host: 9729 members, 9 MB unpacked) by one to two orders of magnitude.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from umbp_sim.dump.dump_error import DumpError


@dataclass(frozen=True)
class ArchiveLimits:
    """What one dump may cost. Tests pass smaller values to reach each limit cheaply."""

    max_archive: int = 256 << 20  # bytes of the file as given (compressed)
    max_file: int = 4 << 20  # one file the parsers read (cpuinfo of a big host is ~1 MiB)
    max_unpacked: int = 256 << 20  # bytes after decompression, headers and skipped data included
    max_members: int = 100_000  # tar headers of any type
    max_header: int = 64 << 10  # one pax or GNU long-name/long-link header
    max_name: int = 4096  # a member or link name (PATH_MAX)
    max_streams: int = 100_000  # concatenated gzip/bzip2/xz streams
    max_kept: int = 64 << 20  # bytes of the members kept in memory (the ones parsers read)
    max_seconds: float = 20.0  # wall clock for reading the archive (a backstop)


DEFAULT_LIMITS = ArchiveLimits()

MAX_RELEASE_PART = 65535  # a kernel release X.Y.Z: each part (patch levels pass 255)


class DumpLimitError(DumpError):
    """A dump crossed one of the ``ArchiveLimits``; ``limit`` is the field's name."""

    def __init__(self, where: str, limit: str, what: str, detail: str) -> None:
        self.limit = limit
        super().__init__(where, f"over the {what} limit: {detail}", kind="unreadable")


class Budget:
    """Counts what reading one archive has cost so far; raises ``DumpLimitError`` past a limit."""

    def __init__(self, label: str, limits: ArchiveLimits = DEFAULT_LIMITS) -> None:
        self.label = label
        self.limits = limits
        self.input = 0
        self.unpacked = 0
        self.members = 0
        self.streams = 0
        self.kept = 0
        self.deadline = time.monotonic() + limits.max_seconds

    def _over(self, limit: str, what: str, detail: str) -> DumpLimitError:
        return DumpLimitError(self.label, limit, what, detail)

    def add_input(self, n: int) -> None:
        self.input += n
        if self.input > self.limits.max_archive:
            raise self._over(
                "max_archive", "archive-size", f"larger than {self.limits.max_archive} bytes"
            )

    def add_unpacked(self, n: int) -> None:
        self.unpacked += n
        if self.unpacked > self.limits.max_unpacked:
            raise self._over(
                "max_unpacked",
                "unpacked-size",
                f"more than {self.limits.max_unpacked} bytes after decompression",
            )
        self.check_time()

    def add_stream(self) -> None:
        self.streams += 1
        if self.streams > self.limits.max_streams:
            raise self._over(
                "max_streams",
                "stream-count",
                f"more than {self.limits.max_streams} concatenated compressed streams",
            )
        self.check_time()

    def add_member(self) -> None:
        self.members += 1
        if self.members > self.limits.max_members:
            raise self._over(
                "max_members", "member-count", f"more than {self.limits.max_members} members"
            )
        if not self.members % 1024:
            self.check_time()

    def check_header(self, kind: str, size: int) -> None:
        if size > self.limits.max_header:
            raise self._over(
                "max_header",
                "header-size",
                f"a {kind} header of {size} bytes (at most {self.limits.max_header})",
            )

    def add_kept(self, n: int) -> None:
        self.kept += n
        if self.kept > self.limits.max_kept:
            raise self._over(
                "max_kept",
                "kept-size",
                f"the files umbp-sim reads total more than {self.limits.max_kept} bytes",
            )

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise self._over(
                "max_seconds",
                "time",
                f"still reading after {self.limits.max_seconds:g} s",
            )
