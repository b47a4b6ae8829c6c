"""``open_dump``: a path (a dump directory, a tarball or a bare meminfo file) to its
``DumpSource``; ``bytes_source``: the same for bytes (a tarball or meminfo text).
"""

from __future__ import annotations

import errno
import os
import stat

from umbp_sim.dump.archive import TAR_SUFFIXES, stem, tar_source
from umbp_sim.dump.directory import dir_dump
from umbp_sim.dump.dump_error import DumpError, DumpNotFound
from umbp_sim.dump.limits import DEFAULT_LIMITS, ArchiveLimits
from umbp_sim.dump.source import DumpSource, MemorySource, kind_name, read_capped
from umbp_sim.dump.tarscan import BZ2_MAGIC, GZIP_MAGIC, XZ_MAGIC

_COMPRESSED_MAGIC = (GZIP_MAGIC, BZ2_MAGIC, XZ_MAGIC)


def _looks_like_tar(data: bytes) -> bool:
    return data.startswith(_COMPRESSED_MAGIC) or (len(data) >= 512 and data[257:262] == b"ustar")


def bytes_source(
    data: bytes,
    label: str,
    tar_hint: bool | None = None,
    limits: ArchiveLimits = DEFAULT_LIMITS,
) -> MemorySource:
    """A dump given as the bytes of a tarball or of a bare meminfo file.

    ``tar_hint`` True/False forces the kind; None sniffs it (a tar header, or a compressed
    stream, is a tarball; anything else is text as pasted: a meminfo, whole or grep'd, and the
    other forms of ``umbp_sim.dump.paste``).
    """
    is_tar = _looks_like_tar(data) if tar_hint is None else tar_hint
    if is_tar:
        return tar_source(data, label, limits)
    if len(data) > limits.max_file:
        raise DumpError(label, f"larger than {limits.max_file} bytes", kind="unreadable")
    from umbp_sim.dump.paste import paste_source  # a bare meminfo is a paste too

    return paste_source(data, label, stem(label))


def open_dump(
    path: str | os.PathLike[str],
    *,
    follow_symlinks: bool = True,
    bare: bool = True,
    limits: ArchiveLimits = DEFAULT_LIMITS,
) -> DumpSource:
    """A directory, a .tar/.tar.gz/.tar.bz2/.tar.xz, or a bare meminfo file.

    ``follow_symlinks=False`` refuses a dump that is itself a symbolic link; ``bare=False``
    refuses a file that is not a tarball. Scenario files' ``dump =`` uses both.
    """
    label = os.fspath(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(label, flags)
    except FileNotFoundError:
        raise DumpNotFound(label, "no such file or directory", kind="missing") from None
    except OSError as e:
        if e.errno == errno.ELOOP and not follow_symlinks:
            raise DumpError(label, "is a symbolic link (not followed here)",
                            kind="unreadable") from None  # fmt: skip
        raise DumpError(label, f"cannot open: {e.strerror}", kind="unreadable") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            owned, fd = fd, -1  # _dir_dump owns it now
            return dir_dump(label, owned)
        if not stat.S_ISREG(mode):
            raise DumpError(label, f"is {kind_name(mode)}, expected a dump directory, "
                            "tarball or meminfo file", kind="unreadable")  # fmt: skip
        head = _read_head(fd, label)
        tar_hint = True if label.endswith(TAR_SUFFIXES) else None
        if tar_hint or _looks_like_tar(head):
            return tar_source(head, label, limits, more=lambda n: _read_some(fd, n, label))
        if not bare:
            raise DumpError(label, "not a dump directory or tarball (a bare meminfo file is not "
                            "accepted here)", kind="unreadable")  # fmt: skip
        data = head + read_capped(fd, label, limits.max_file - len(head), limits.max_file)
    finally:
        if fd >= 0:
            os.close(fd)
    return bytes_source(data, label, False, limits)


def _read_some(fd: int, n: int, where: str) -> bytes:
    try:
        return os.read(fd, n)
    except OSError as e:
        raise DumpError(where, f"cannot read: {e.strerror}", kind="unreadable") from None


def _read_head(fd: int, where: str, n: int = 512) -> bytes:
    """The first ``n`` bytes (fewer for a shorter file), enough to tell a tarball."""
    head = b""
    while len(head) < n and (chunk := _read_some(fd, n - len(head), where)):
        head += chunk
    return head
