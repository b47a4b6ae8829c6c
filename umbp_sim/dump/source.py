"""Where a dump's files come from: a directory, a tarball read in memory, or a bare meminfo.

``open_dump(path)`` returns a ``DumpSource``: ``read(rel)`` gives a file's text or None when the
dump does not have it, ``listdir(rel)`` the names under a directory, ``where(rel)`` how to name
the file in an error (``dump.tar.bz2:X/proc/meminfo``). ``rel`` is relative to the dump's root
(``proc/meminfo``), whatever top directory (``NAME/``) the dump has.

Safety: tarballs are never extracted; only members a parser may ask for are read, each capped
in size. Members with absolute names or ``..`` components, and links whose target is absolute
or leaves the dump, are not served (``rejected`` lists them). A directory dump is read through
``realpath`` and a file whose real path leaves the dump's root is treated the same way.
"""

from __future__ import annotations

import io
import lzma
import os
import posixpath
import re
import tarfile
import zlib

from umbp_sim.dump.errors import DumpError

MAX_FILE = 4 << 20  # largest single dump file read (cpuinfo of a big host is ~1 MiB)
MAX_ARCHIVE = 256 << 20  # largest archive/bare file read into memory
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tbz", ".tar.xz", ".txz")

# The files any parser reads (relative to the dump root). Tar members outside this are skipped.
RELEVANT = re.compile(
    r"^(?:proc/(?:meminfo|version|cpuinfo|self/limits|sys/vm/[a-z_]+|sys/kernel/osrelease)"
    r"|sys/kernel/mm/hugepages/.+"
    r"|sys/devices/system/node/(?:online|possible|has_memory"
    r"|node[0-9]+/(?:meminfo|cpulist|distance|hugepages/.+))"
    r"|sys/fs/cgroup/(?:memory\.max|hugetlb\.[^/]+\.max)"
    r"|umbp-sim-collect\.json)$"
)
_COMPRESSED_MAGIC = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")


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
        self.dirs: set[str] = set(dirs or ())
        for path in files:
            parts = path.split("/")
            for i in range(1, len(parts)):
                self.dirs.add("/".join(parts[:i]))

    def where(self, rel: str) -> str:
        if self.bare_meminfo:
            return self.label
        return f"{self.label}:{self.prefix}{rel}"

    def _read_bytes(self, rel: str) -> bytes | None:
        return self.files.get(rel)

    def listdir(self, rel: str) -> list[str]:
        rel = rel.rstrip("/")
        if rel not in self.dirs:
            return []
        start = rel + "/"
        names = {p[len(start) :].split("/", 1)[0] for p in self.files if p.startswith(start)}
        names |= {d[len(start) :].split("/", 1)[0] for d in self.dirs if d.startswith(start)}
        return sorted(names)


class DirSource(DumpSource):
    """A dump unpacked in a directory (``root`` contains ``proc/`` and ``sys/``)."""

    def __init__(self, root: str, label: str) -> None:
        self.root = root
        self.real_root = os.path.realpath(root)
        self.label = label
        self.name = os.path.basename(os.path.normpath(root)) or "dump"
        self.rejected = []

    def where(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def _inside(self, rel: str) -> str | None:
        path = os.path.realpath(os.path.join(self.root, rel))
        if path != self.real_root and not path.startswith(self.real_root + os.sep):
            if rel not in self.rejected:
                self.rejected.append(rel)
            return None
        return path

    def _read_bytes(self, rel: str) -> bytes | None:
        path = self._inside(rel)
        if path is None or not os.path.exists(path):
            return None
        if os.path.isdir(path):
            raise DumpError(self.where(rel), "is a directory, expected a file", kind="unreadable")
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_FILE + 1)
        except OSError as e:
            raise DumpError(
                self.where(rel), f"cannot read: {e.strerror}", kind="unreadable"
            ) from None
        if len(data) > MAX_FILE:
            raise DumpError(self.where(rel), f"larger than {MAX_FILE} bytes", kind="unreadable")
        return data

    def listdir(self, rel: str) -> list[str]:
        path = self._inside(rel)
        if path is None or not os.path.isdir(path):
            return []
        try:
            return sorted(os.listdir(path))
        except OSError:
            return []


def _safe_member_name(name: str) -> str | None:
    name = name.replace("\\", "/")
    while name.startswith("./"):
        name = name[2:]
    name = name.rstrip("/")
    if not name or name.startswith("/") or ".." in name.split("/"):
        return None
    return posixpath.normpath(name)


def _find_prefix(names: set[str], label: str) -> str:
    if "proc/meminfo" in names:
        return ""
    tops = sorted(n[: -len("/proc/meminfo")] for n in names if n.endswith("/proc/meminfo"))
    tops = [t for t in tops if "/" not in t]
    if len(tops) == 1:
        return tops[0] + "/"
    if len(tops) > 1:
        raise DumpError(label, f"holds {len(tops)} dumps ({', '.join(tops[:4])}), expected one")
    raise DumpError(
        label, "not a machine dump: no proc/meminfo nor NAME/proc/meminfo inside", kind="missing"
    )


def tar_source(data: bytes, label: str) -> MemorySource:
    """Read a (compressed) tarball from bytes; only the RELEVANT members are kept."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
            members = []
            for m in tar:
                name = _safe_member_name(m.name)
                members.append((m, name))
            names = {
                n for m, n in members if n is not None and (m.isfile() or m.islnk() or m.issym())
            }
            prefix = _find_prefix(names, label)
            files: dict[str, bytes] = {}
            dirs: set[str] = set()
            links: dict[str, str] = {}
            rejected: list[str] = []
            for m, name in members:
                if name is None:
                    rejected.append(m.name)
                    continue
                if prefix and not name.startswith(prefix):
                    continue
                rel = name[len(prefix) :]
                if m.isdir():
                    dirs.add(rel)
                    continue
                if not RELEVANT.match(rel):
                    continue
                if m.issym() or m.islnk():
                    # symlink targets are relative to the link's directory, hard links name
                    # another member; either must stay inside the dump.
                    target = m.linkname
                    if m.issym() and not target.startswith("/"):
                        target = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
                    safe = _safe_member_name(target)
                    if safe is None or not safe.startswith(prefix):
                        rejected.append(m.name)
                    else:
                        links[rel] = safe[len(prefix) :]
                    continue
                if not m.isfile():
                    continue
                if m.size > MAX_FILE:
                    raise DumpError(f"{label}:{name}", f"larger than {MAX_FILE} bytes")
                f = tar.extractfile(m)
                files[rel] = f.read() if f is not None else b""
    except DumpError:
        raise
    except (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError, ValueError) as e:
        raise DumpError(label, f"corrupt or unreadable tarball: {e}", kind="unreadable") from None
    for rel, target in links.items():
        for _ in range(8):  # follow link chains a little, inside the archive only
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


def bytes_source(data: bytes, label: str, tar_hint: bool | None = None) -> MemorySource:
    """A dump given as the bytes of a tarball or of a bare meminfo file.

    ``tar_hint`` True/False forces the kind; None sniffs it (a tar header, or a compressed
    stream, is a tarball; anything else is read as meminfo text).
    """
    is_tar = tar_hint
    if is_tar is None:
        is_tar = data.startswith(_COMPRESSED_MAGIC) or (
            len(data) >= 512 and data[257:262] == b"ustar"
        )
    if is_tar:
        return tar_source(data, label)
    return MemorySource({"proc/meminfo": data}, label, _stem(label), bare_meminfo=True, rejected=[])


def open_dump(path: str | os.PathLike[str]) -> DumpSource:
    """A directory, a .tar/.tar.gz/.tar.bz2/.tar.xz, or a bare meminfo file."""
    label = os.fspath(path)
    if not os.path.exists(label):
        raise DumpError(label, "no such file or directory", kind="missing")
    if os.path.isdir(label):
        if os.path.isfile(os.path.join(label, "proc", "meminfo")):
            return DirSource(label, label)
        try:
            subs = sorted(
                d
                for d in os.listdir(label)
                if os.path.isfile(os.path.join(label, d, "proc", "meminfo"))
            )
        except OSError as e:
            raise DumpError(label, f"cannot list: {e.strerror}", kind="unreadable") from None
        if len(subs) == 1:
            return DirSource(os.path.join(label, subs[0]), label)
        if len(subs) > 1:
            raise DumpError(label, f"holds {len(subs)} dumps ({', '.join(subs[:4])}), expected one")
        raise DumpError(
            label,
            "not a machine dump: no proc/meminfo nor NAME/proc/meminfo inside",
            kind="missing",
        )
    try:
        with open(label, "rb") as f:
            data = f.read(MAX_ARCHIVE + 1)
    except OSError as e:
        raise DumpError(label, f"cannot read: {e.strerror}", kind="unreadable") from None
    if len(data) > MAX_ARCHIVE:
        raise DumpError(label, f"larger than {MAX_ARCHIVE} bytes", kind="unreadable")
    tar_hint = True if label.endswith(TAR_SUFFIXES) else None
    return bytes_source(data, label, tar_hint)
