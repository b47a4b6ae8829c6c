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
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
import stat
import weakref
from collections.abc import Callable

from umbp_sim.dump.errors import DumpError, DumpNotFound
from umbp_sim.dump.limits import DEFAULT_LIMITS, ArchiveLimits, Budget
from umbp_sim.dump.manifest import check_manifest, cut_short_error
from umbp_sim.dump.tarscan import BZ2_MAGIC, GZIP_MAGIC, XZ_MAGIC, Input, TarFormatError, scan

MAX_FILE = DEFAULT_LIMITS.max_file  # largest single dump file read
MAX_ARCHIVE = DEFAULT_LIMITS.max_archive  # largest archive/bare file read into memory
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tbz", ".tar.xz", ".txz")
MAX_LINK_HOPS = 8  # symbolic links followed (inside the dump) for one path
MAX_REL_DEPTH = 12  # components of a path any parser asks for (the deepest has 8)
MAX_REL_LEN = 512
LINK_LEAVES = "a %s link leaving the dump: not followed (a dump holds copies, not links)"

# The files any parser reads (relative to the dump root). Tar members outside this are skipped.
RELEVANT = re.compile(
    r"^(?:proc/(?:meminfo|zoneinfo|version|cpuinfo|self/limits|sys/vm/[a-z_]+|sys/kernel/osrelease)"
    r"|sys/kernel/mm/hugepages/.+"
    r"|sys/devices/system/node/(?:online|possible|has_memory"
    r"|node[0-9]+/(?:meminfo|cpulist|distance|hugepages/.+))"
    r"|sys/fs/cgroup/(?:memory\.max|hugetlb\.[^/]+\.max)"
    r"|sos_commands/(?:kernel/(?:sysctl_-a|uname_-a)|host/hostname)"  # sosreport.py
    r"|umbp-sim-collect\.json)$"
)
_COMPRESSED_MAGIC = (GZIP_MAGIC, BZ2_MAGIC, XZ_MAGIC)
_O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_O_DIR = os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC


def relevant(rel: str) -> bool:
    """Whether a parser may read ``rel`` (a dump-root-relative path)."""
    return len(rel) <= MAX_REL_LEN and rel.count("/") < MAX_REL_DEPTH and bool(RELEVANT.match(rel))


def _kind_name(mode: int) -> str:
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
    """The files of one dump. Subclasses implement ``_read_bytes`` and ``listdir``."""

    label: str  # how the user named the dump
    name: str  # NAME: the dump's top directory, or the file's name
    bare_meminfo: bool = False
    rejected: list[str]

    def where(self, rel: str) -> str:
        raise NotImplementedError

    def _read_bytes(self, rel: str) -> bytes | None:
        raise NotImplementedError

    def listdir(self, rel: str) -> list[str]:
        raise NotImplementedError

    def read(self, rel: str) -> str | None:
        """The file's text, or None if the dump does not have it.

        Trailing NUL bytes are dropped: hwloc-gather-topology pads some sysfs copies with one.
        """
        data = self._read_bytes(rel)
        return None if data is None else decode(data.rstrip(b"\0"), self.where(rel))

    def exists(self, rel: str) -> bool:
        return self._read_bytes(rel) is not None

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

    def _read_bytes(self, rel: str) -> bytes | None:
        return self.files.get(rel)

    def listdir(self, rel: str) -> list[str]:
        return sorted(self.children.get(rel.rstrip("/"), ()))


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

    def _read_bytes(self, rel: str) -> bytes | None:
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
                raise DumpError(where, f"is {_kind_name(st.st_mode)}, expected a regular file",
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
                raise DumpError(where, f"is {_kind_name(st.st_mode)}, expected a regular file",
                                kind="unreadable")  # fmt: skip
            return _read_capped(fd, where)
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


def _read_capped(fd: int, where: str, cap: int = MAX_FILE, limit: int | None = None) -> bytes:
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


def _safe_member_name(name: str) -> str | None:
    name = name.replace("\\", "/")
    while name.startswith("./"):
        name = name[2:]
    name = name.rstrip("/")
    if not name or name.startswith("/") or ".." in name.split("/"):
        return None
    return posixpath.normpath(name)


NOT_A_DUMP = (
    "not a machine dump: no proc/meminfo nor sys/devices/system/node/nodeN/meminfo inside "
    "(at its top or under one NAME/)"
)


def _find_prefix(names: set[str], label: str) -> str:
    """The dump's top directory (``NAME/``, or ``""``): where proc/meminfo, or failing that a
    nodeN/meminfo (``hwloc.marker_top``), is."""
    from umbp_sim.dump.hwloc import marker_top

    if "proc/meminfo" in names:
        return ""
    marked = {t for t in map(marker_top, names) if t is not None}
    with_proc = {n[: -len("proc/meminfo")].rstrip("/") for n in names if n.endswith("proc/meminfo")}
    tops = sorted(marked & with_proc or marked)
    if tops == [""]:
        return ""
    if len(tops) == 1:
        return tops[0] + "/"
    if len(tops) > 1:
        raise DumpError(label, f"holds {len(tops)} dumps ({', '.join(tops[:4])}), expected one")
    raise DumpError(label, NOT_A_DUMP, kind="missing")


def _wanted(name: str) -> bool:
    """A member a parser may read, at the dump's root or under one top directory (a name of
    at most NAME_MAX characters)."""
    if relevant(name):
        return True
    top, sep, rest = name.partition("/")
    return bool(sep) and len(top) <= 255 and relevant(rest)


def _kept_dir(name: str) -> bool:
    """A directory member worth listing: as deep and long as a wanted file's directory."""
    return len(name) <= 255 + 1 + MAX_REL_LEN and name.count("/") <= MAX_REL_DEPTH + 1


def tar_source(
    data: bytes,
    label: str,
    limits: ArchiveLimits = DEFAULT_LIMITS,
    more: Callable[[int], bytes] | None = None,
) -> MemorySource:
    """Read a (compressed) tarball from bytes; only the RELEVANT members are kept.

    ``more(n)``, if given, reads the rest of the archive after ``data`` (a file read in steps,
    never whole). Bounded by ``limits`` (``umbp_sim.dump.limits``): crossing one is a
    ``DumpLimitError``.
    """
    budget = Budget(label, limits)
    try:
        src = Input(data, more or (lambda n: b""), budget)
        found = scan(src, _wanted, _safe_member_name, budget, _kept_dir)
    except TarFormatError as e:
        if e.cut_short:  # what ended, and what the manifest says is lost (dump/manifest.py)
            raise cut_short_error(label, str(e), e.partial) from None
        raise DumpError(label, f"corrupt or unreadable tarball: {e}", kind="unreadable") from None
    check_manifest(found, label)
    try:
        prefix = _find_prefix(found.names, label)
    except DumpError as e:
        from umbp_sim.dump.hwloc import must_gather_nodes

        nodes = must_gather_nodes(found.sizes) if e.kind == "missing" else []
        if not nodes:
            raise
        rest = f" (and {len(nodes) - 3} more)" if len(nodes) > 3 else ""
        raise DumpError(
            label,
            f"a must-gather of {len(nodes)} node dumps ({', '.join(nodes[:3])}{rest}), not one "
            "dump: unpack it and replay the directory (a row per node)",
        ) from None
    files: dict[str, bytes] = {}
    dirs: set[str] = set()
    links: dict[str, str] = {}
    rejected = list(found.refused)
    if found.refused_count > len(found.refused):
        rejected.append(f"... and {found.refused_count - len(found.refused)} more members")
    for name, size in found.oversized.items():
        if name.startswith(prefix):
            raise DumpError(f"{label}:{name}", f"larger than {limits.max_file} bytes ({size})")
    for name, content in found.files.items():
        if name.startswith(prefix) and relevant(name[len(prefix) :]):
            files[name[len(prefix) :]] = content
    for d in found.dirs:
        rel = d[len(prefix) :] if d.startswith(prefix) else None
        if rel and len(rel) <= MAX_REL_LEN and rel.count("/") < MAX_REL_DEPTH:
            dirs.add(rel)
    for link in found.links:
        name = link.name
        if not name.startswith(prefix) or not relevant(name[len(prefix) :]):
            continue
        # symlink targets are relative to the link's directory, hard links name another
        # member; either must stay inside the dump.
        target = link.target
        if link.symbolic and not target.startswith("/"):
            target = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
        safe = _safe_member_name(target)
        if safe is None or not safe.startswith(prefix):
            kind = "symbolic" if link.symbolic else "hard"
            raise DumpError(f"{label}:{name}", LINK_LEAVES % kind, kind="unreadable")
        else:
            links[name[len(prefix) :]] = safe[len(prefix) :]
    for rel, target in links.items():
        for _ in range(MAX_LINK_HOPS):  # follow link chains a little, inside the archive only
            if target in files:
                files[rel] = files[target]
                break
            if target not in links:
                break
            target = links[target]
    return MemorySource(files, label, prefix.rstrip("/") or _stem(label), prefix, dirs, rejected)


def _stem(label: str) -> str:
    base = os.path.basename(label)
    for suffix in TAR_SUFFIXES:
        if base.endswith(suffix):
            return base[: -len(suffix)]
    return base or "dump"


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
    stream, is a tarball; anything else is read as meminfo text).
    """
    is_tar = _looks_like_tar(data) if tar_hint is None else tar_hint
    if is_tar:
        return tar_source(data, label, limits)
    if len(data) > limits.max_file:
        raise DumpError(label, f"larger than {limits.max_file} bytes", kind="unreadable")
    return MemorySource({"proc/meminfo": data}, label, _stem(label), bare_meminfo=True, rejected=[])


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
            return _dir_dump(label, owned)
        if not stat.S_ISREG(mode):
            raise DumpError(label, f"is {_kind_name(mode)}, expected a dump directory, "
                            "tarball or meminfo file", kind="unreadable")  # fmt: skip
        head = _read_head(fd, label)
        tar_hint = True if label.endswith(TAR_SUFFIXES) else None
        if tar_hint or _looks_like_tar(head):
            return tar_source(head, label, limits, more=lambda n: _read_some(fd, n, label))
        if not bare:
            raise DumpError(label, "not a dump directory or tarball (a bare meminfo file is not "
                            "accepted here)", kind="unreadable")  # fmt: skip
        data = head + _read_capped(fd, label, limits.max_file - len(head), limits.max_file)
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


def _check_dir_manifest(src: DirSource) -> None:
    """A collect manifest's files all there, at their sizes (dump/manifest.py); closes ``src``
    when they are not."""
    from umbp_sim.dump.manifest import check_dir_manifest

    try:
        check_dir_manifest(src)
    except BaseException:
        src.close()
        raise


def _dir_dump(label: str, fd: int) -> DirSource:
    """The dump in directory ``fd``: itself, or its one subdirectory holding proc/meminfo."""
    from umbp_sim.dump.hwloc import is_dump_root

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
