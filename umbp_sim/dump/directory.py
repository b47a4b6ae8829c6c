"""A dump unpacked in a directory, read relative to a directory fd: every component opened
with ``O_NOFOLLOW``, links resolved by umbp-sim only while they stay inside the dump, only
regular files read (see ``source.py``'s docstring); a collect manifest beside it is checked.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
import weakref

from umbp_sim.dump.dump_error import DumpError
from umbp_sim.dump.hwloc import is_dump_root
from umbp_sim.dump.manifest import check_dir_manifest
from umbp_sim.dump.source import (
    LINK_LEAVES,
    MAX_LINK_HOPS,
    NOT_A_DUMP,
    DumpSource,
    kind_name,
    read_capped,
)

_O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_O_DIR = os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC


class DirSource(DumpSource):
    """A dump unpacked in a directory (``root`` contains ``proc/`` and ``sys/``).

    ``root_fd`` is an open directory fd the source owns (closed by ``close()`` or when the
    source is collected); every file is reached from it, see the module docstring.
    """

    def __init__(self, root: str, label: str, root_fd: int | None = None) -> None:
        self.root = root
        self.label = label
        self.name = os.path.basename(os.path.normpath(root)) or "dump"
        self.rejected = []
        if root_fd is None:
            try:
                root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError as e:
                raise DumpError(root, f"cannot open: {e.strerror}", kind="unreadable") from None
        self.fd = root_fd
        self._close = weakref.finalize(self, os.close, root_fd)
        self._cache: dict[str, bytes | None] = {}

    def close(self) -> None:
        self._close()

    def where(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def _reject(self, rel: str) -> None:
        if rel not in self.rejected and len(self.rejected) < 50:
            self.rejected.append(rel)

    def _walk(self, rel: str) -> tuple[int, str, str] | None:
        """(fd of the parent directory, last component, the path as resolved) for ``rel``,
        or None when it is not in the dump. The caller closes the fd (unless it is the root's).
        Symbolic links are followed by hand, only while they stay inside the dump."""
        path = rel
        for _ in range(MAX_LINK_HOPS + 1):
            parts = path.split("/")
            if any(p in ("", ".", "..") for p in parts):
                self._reject(rel)
                return None
            fd = self.fd
            link_at: int | None = None
            try:
                for i, part in enumerate(parts[:-1]):
                    try:
                        nfd = os.open(part, _O_DIR, dir_fd=fd)
                    except OSError as e:
                        if e.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(part, fd):
                            link_at = i
                            break
                        if e.errno in (errno.ENOENT, errno.ENOTDIR):
                            if fd != self.fd:
                                os.close(fd)
                            return None
                        raise
                    if fd != self.fd:
                        os.close(fd)
                    fd = nfd
                if link_at is None:
                    last = parts[-1]
                    if not _is_link(last, fd):
                        return fd, last, path
                    link_at = len(parts) - 1
                target = os.readlink(parts[link_at], dir_fd=fd)
            except OSError as e:
                if fd != self.fd:
                    os.close(fd)
                raise DumpError(
                    self.where(rel), f"cannot read: {e.strerror}", kind="unreadable"
                ) from None
            if fd != self.fd:
                os.close(fd)
            base = "/".join(parts[:link_at])
            joined = posixpath.normpath(posixpath.join(base, target))
            if target.startswith("/") or joined == ".." or joined.startswith("../"):
                # a dump made of links to the live host (or a planted one): one line, never
                # a replay of the machine without that file
                link = self.where("/".join(parts[: link_at + 1]))
                raise DumpError(link, LINK_LEAVES % "symbolic", kind="unreadable")
            rest = parts[link_at + 1 :]
            path = "/".join(rest if joined == "." else [joined, *rest])
        self._reject(rel)
        return None

    def read_bytes(self, rel: str) -> bytes | None:
        if rel in self._cache:
            return self._cache[rel]
        data = self._read_once(rel)
        self._cache[rel] = data
        return data

    def _read_once(self, rel: str) -> bytes | None:
        walked = self._walk(rel)
        if walked is None:
            return None
        dfd, last, _ = walked
        where = self.where(rel)
        try:
            try:
                st = os.stat(last, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                return None
            if not stat.S_ISREG(st.st_mode):  # never open a FIFO or a device
                raise DumpError(where, f"is {kind_name(st.st_mode)}, expected a regular file",
                                kind="unreadable")  # fmt: skip
            fd = os.open(last, _O_FILE, dir_fd=dfd)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise DumpError(where, f"cannot read: {e.strerror}", kind="unreadable") from None
        finally:
            if dfd != self.fd:
                os.close(dfd)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):  # swapped in between the stat and the open
                raise DumpError(where, f"is {kind_name(st.st_mode)}, expected a regular file",
                                kind="unreadable")  # fmt: skip
            return read_capped(fd, where)
        finally:
            os.close(fd)

    def listdir(self, rel: str) -> list[str]:
        walked = self._walk(rel.rstrip("/")) if rel.strip("/") else None
        if walked is None:
            if rel.strip("/"):
                return []
            try:
                return sorted(os.listdir(self.fd))
            except OSError:
                return []
        dfd, last, _ = walked
        try:
            fd = os.open(last, _O_DIR, dir_fd=dfd)
        except OSError:
            return []
        finally:
            if dfd != self.fd:
                os.close(dfd)
        try:
            return sorted(os.listdir(fd))
        except OSError:
            return []
        finally:
            os.close(fd)


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _check_dir_manifest(src: DirSource) -> None:
    """A collect manifest's files all there, at their sizes (dump/manifest.py); closes ``src``
    when they are not."""
    try:
        check_dir_manifest(src.read_bytes, src.where, src.label)
    except BaseException:
        src.close()
        raise


def dir_dump(label: str, fd: int) -> DirSource:
    """The dump in directory ``fd``: itself, or its one subdirectory holding proc/meminfo."""
    top = DirSource(label, label, root_fd=fd)
    try:
        if is_dump_root(top):
            _check_dir_manifest(top)
            return top
        names = sorted(os.listdir(fd))
    except OSError as e:
        top.close()
        raise DumpError(label, f"cannot list: {e.strerror}", kind="unreadable") from None
    except BaseException:
        top.close()
        raise
    subs: list[DirSource] = []
    for d in names:
        try:
            sub_fd = os.open(d, _O_DIR, dir_fd=fd)
        except OSError:
            continue  # not a directory, or a symbolic link
        sub = DirSource(os.path.join(label, d), label, root_fd=sub_fd)
        try:
            found = is_dump_root(sub)
        except BaseException:
            for other in (sub, top, *subs):
                other.close()
            raise
        if found:
            subs.append(sub)
        else:
            sub.close()
    top.close()
    if len(subs) == 1:
        _check_dir_manifest(subs[0])
        return subs[0]
    for sub in subs:
        sub.close()
    if len(subs) > 1:
        listed = ", ".join(sub.name for sub in subs[:4])
        raise DumpError(label, f"holds {len(subs)} dumps ({listed}), expected one")
    raise DumpError(label, NOT_A_DUMP, kind="missing")
