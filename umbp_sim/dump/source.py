"""Where a dump's files come from: a directory, a tarball read in memory, or a bare meminfo.

``open_dump(path)`` returns a ``DumpSource``: ``read(rel)`` gives a file's text or None when the
dump does not have it, ``listdir(rel)`` the names under a directory, ``where(rel)`` how to name
the file in an error (``dump.tar.bz2:X/proc/meminfo``). ``rel`` is relative to the dump's root
(``proc/meminfo``), whatever top directory (``NAME/``) the dump has.

Safety (a dump is untrusted input):

- Tarballs are never extracted: ``tarscan`` reads them once, in memory, within the bounds of
  ``limits.ArchiveLimits`` (header size, member count, decompressed bytes, streams, time), and
  only members a parser may ask for are kept. Members with absolute names or ``..`` components
  are not served (``rejected`` lists them); a link a parser may ask for whose target is
  absolute or leaves the dump is an error naming it (LINK_LEAVES).
- A directory dump is read relative to a directory fd: every path component is opened with
  ``O_NOFOLLOW``, a file with ``O_NONBLOCK`` too, and it must be a regular file after opening
  (a FIFO, device or socket is an error, never a hang). Symbolic links inside the dump are
  resolved by umbp-sim itself, and only while they stay inside it: a link a parser reaches
  that leaves the dump (``proc/meminfo -> /proc/meminfo``) is an error naming it, never read
  and never replayed as a machine without that file; each file is opened once
  (``read`` and ``exists`` share the bytes). Nothing outside the dump is ever read, so no error
  can quote it.
- ``open_dump(..., follow_symlinks=False, bare=False)`` (scenario files' ``dump =``) also
  refuses a symbolic link as the dump itself and a bare file that is not a tarball.

``source.py`` holds what every source shares (``DumpSource``, ``MemorySource``, the files a
parser may read); ``archive.py`` serves a tarball, ``directory.py`` a directory, and
``opener.py`` picks one for a path or bytes (``open_dump``, ``bytes_source``).
"""

from __future__ import annotations

import os
import re
import stat

from umbp_sim.dump.dump_error import DumpError
from umbp_sim.dump.limits import DEFAULT_LIMITS

MAX_FILE = DEFAULT_LIMITS.max_file  # largest single dump file read
MAX_LINK_HOPS = 8  # symbolic links followed (inside the dump) for one path
MAX_REL_DEPTH = 12  # components of a path any parser asks for (the deepest has 8)
MAX_REL_LEN = 512
LINK_LEAVES = "a %s link leaving the dump: not followed (a dump holds copies, not links)"

# The files any parser reads (relative to the dump root). Tar members outside this are skipped.
RELEVANT = re.compile(
    r"^(?:proc/(?:meminfo|zoneinfo|version|cpuinfo|self/limits|self/status|sys/vm/[a-z_]+|sys/kernel/osrelease)"
    r"|sys/kernel/mm/hugepages/.+"
    r"|sys/devices/system/node/(?:online|possible|has_memory"
    r"|node[0-9]+/(?:meminfo|cpulist|distance|hugepages/.+))"
    r"|sys/fs/cgroup/(?:memory\.max|hugetlb\.[^/]+\.max"
    r"|(?:memory/|hugetlb/)?(?:memory|hugetlb\.[^/]+)\.limit_in_bytes)"
    r"|sos_commands/(?:kernel/(?:sysctl_-a|uname_-a)|host/hostname)"  # sosreport.py
    r"|umbp-sim-collect\.json|umbp-sim-hugetlbfs\.tsv)$"
)


def relevant(rel: str) -> bool:
    """Whether a parser may read ``rel`` (a dump-root-relative path)."""
    return len(rel) <= MAX_REL_LEN and rel.count("/") < MAX_REL_DEPTH and bool(RELEVANT.match(rel))


def kind_name(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def decode(data: bytes, where: str) -> str:
    """Bytes of a /proc or /sys file as text; non-UTF-8 bytes are a malformed file."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DumpError(
            where, f"not text: byte 0x{data[e.start]:02x} cannot be decoded", line
        ) from None


class DumpSource:
    """The files of one dump. Subclasses implement ``read_bytes`` and ``listdir``."""

    label: str  # how the user named the dump
    name: str  # NAME: the dump's top directory, or the file's name
    bare_meminfo: bool = False
    paste: bool = False  # text as pasted (dump/paste.py): what it does not show is unknown
    rejected: list[str]

    def where(self, rel: str) -> str:
        raise NotImplementedError

    def read_bytes(self, rel: str) -> bytes | None:
        """The file's bytes as the dump holds them, or None if the dump does not have it."""
        raise NotImplementedError

    def listdir(self, rel: str) -> list[str]:
        raise NotImplementedError

    def read(self, rel: str) -> str | None:
        """The file's text, or None if the dump does not have it.

        Trailing NUL bytes are dropped: hwloc-gather-topology pads some sysfs copies with one.
        """
        data = self.read_bytes(rel)
        return None if data is None else decode(data.rstrip(b"\0"), self.where(rel))

    def exists(self, rel: str) -> bool:
        return self.read_bytes(rel) is not None

    def close(self) -> None:
        """Release what the source holds open (a directory dump's fd); reads fail after."""


class MemorySource(DumpSource):
    """A dump held in memory: ``files`` maps root-relative paths to bytes."""

    def __init__(
        self,
        files: dict[str, bytes],
        label: str,
        name: str,
        prefix: str = "",
        dirs: set[str] | None = None,
        rejected: list[str] | None = None,
        bare_meminfo: bool = False,
    ) -> None:
        self.files = files
        self.label = label
        self.name = name
        self.prefix = prefix
        self.bare_meminfo = bare_meminfo
        self.rejected = rejected or []
        # directory -> names under it, built once (listdir is asked once per node and size)
        self.children: dict[str, set[str]] = {}
        for path in [*files, *(dirs or ())]:
            parts = path.split("/")
            if len(parts) > MAX_REL_DEPTH + 1:
                continue
            for i in range(1, len(parts)):
                self.children.setdefault("/".join(parts[:i]), set()).add(parts[i])
            self.children.setdefault(path, set()) if path not in files else None
        self.dirs = set(self.children)

    def where(self, rel: str) -> str:
        if self.bare_meminfo:
            return self.label
        return f"{self.label}:{self.prefix}{rel}"

    def read_bytes(self, rel: str) -> bytes | None:
        return self.files.get(rel)

    def listdir(self, rel: str) -> list[str]:
        return sorted(self.children.get(rel.rstrip("/"), ()))


def read_capped(fd: int, where: str, cap: int = MAX_FILE, limit: int | None = None) -> bytes:
    """At most ``cap`` bytes of an open regular file; more is an error naming ``limit``
    (default ``cap``): the whole file's limit when part of it was read already."""
    chunks: list[bytes] = []
    size = 0
    while size <= cap:
        try:
            chunk = os.read(fd, min(1 << 20, cap + 1 - size))
        except OSError as e:
            raise DumpError(where, f"cannot read: {e.strerror}", kind="unreadable") from None
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > cap:
        raise DumpError(where, f"larger than {limit or cap} bytes", kind="unreadable")
    return b"".join(chunks)


NOT_A_DUMP = (
    "not a machine dump: no proc/meminfo nor sys/devices/system/node/nodeN/meminfo inside "
    "(at its top or under one NAME/)"
)
