"""Dump the live host's /proc and /sys into a tarball that ``Machine.from_dump`` reads back.

``collect(out, name)`` writes ``NAME/proc/...`` and ``NAME/sys/...`` (the fixtures' layout):
meminfo, the vm sysctls, the kernel release (as ``proc/sys/kernel/osrelease``), this process's
``proc/self/limits``, every readable file under ``sys/kernel/mm/hugepages``, the node lists and
each ``nodeN/{meminfo,cpulist,distance,hugepages/**}``, and the current cgroup's limits under
their cgroup v2 names (``sys/fs/cgroup/memory.max``, ``sys/fs/cgroup/hugetlb.<size>.max``,
``hugetlb.<size>.rsvd.max``).
A file that cannot be read is listed in ``NAME/umbp-sim-collect.json`` and never fatal.

Cgroup limits: the effective limit is the smallest along the path from the current cgroup to
the root (a parent's ``memory.max`` binds the child). The cgroup v2 path comes from the ``0::``
line of ``/proc/self/cgroup`` and the cgroup2 mount from ``/proc/self/mountinfo``. On a v1
(or hybrid) host whose v2 tree has no limit files, the v1 ``memory`` and ``hugetlb``
controllers' ``*.limit_in_bytes`` are read instead and written under the v2 names (the v1
"no limit" value, ``PAGE_COUNTER_MAX`` pages, becomes ``max``); the manifest says so.

``root`` (default ``/``) lets tests collect from a directory laid out like a host.
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
import tempfile
import time
from dataclasses import dataclass, field

from umbp_sim.errors import UmbpSimError

EX_CANTCREAT = 73
MANIFEST = "umbp-sim-collect.json"
# A v1 limit at or above this is "no limit" (PAGE_COUNTER_MAX * PAGE_SIZE is just below 2**63).
_V1_UNLIMITED = 1 << 62


class CollectError(UmbpSimError):
    """The output cannot be written (the dump itself never fails: missing files are listed)."""

    exit_code = EX_CANTCREAT


@dataclass
class CollectResult:
    path: str
    name: str
    collected: list[str] = field(default_factory=list)  # paths inside the dump
    missing: dict[str, str] = field(default_factory=dict)  # path -> why
    notes: list[str] = field(default_factory=list)


class _Collector:
    def __init__(self, root: str, name: str) -> None:
        self.root = root
        self.name = name
        self.files: dict[str, bytes] = {}
        self.result = CollectResult("", name)

    def host(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def read_host(self, path: str) -> bytes | None:
        try:
            # Small reads: /proc/sys handlers allocate a buffer of the requested size, and a
            # 4 MiB read(2) on them fails with ENOMEM.
            with open(self.host(path), "rb", buffering=0) as f:
                chunks: list[bytes] = []
                size = 0
                while size < 4 << 20:
                    chunk = f.read(65536)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    size += len(chunk)
                return b"".join(chunks)
        except OSError as e:
            self.result.missing[path.lstrip("/")] = e.strerror or type(e).__name__
            return None

    def copy(self, path: str, rel: str | None = None) -> bytes | None:
        """Copy host ``path`` (absolute) into the dump at ``rel`` (default: the same path)."""
        rel = rel or path.lstrip("/")
        data = self.read_host(path)
        if data is not None:
            self.add(rel, data)
        else:
            self.result.missing.setdefault(rel, self.result.missing.pop(path.lstrip("/"), "?"))
        return data

    def add(self, rel: str, data: bytes) -> None:
        self.files[rel] = data
        self.result.collected.append(rel)

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(self.host(path)))
        except OSError as e:
            self.result.missing[path.lstrip("/")] = e.strerror or type(e).__name__
            return []

    def copy_tree(self, path: str) -> None:
        """Every readable regular file under ``path`` (write-only files such as ``demote`` skip)."""
        for entry in self.listdir(path):
            sub = f"{path}/{entry}"
            full = self.host(sub)
            if os.path.islink(full):
                continue
            if os.path.isdir(full):
                self.copy_tree(sub)
            elif os.access(full, os.R_OK) and os.stat(full).st_mode & 0o444:
                self.copy(sub)


def _mountinfo_cgroup(root: str) -> tuple[str | None, dict[str, str]]:
    """(cgroup2 mount point, {v1 controller: mount point}) from /proc/self/mountinfo."""
    v2: str | None = None
    v1: dict[str, str] = {}
    try:
        with open(os.path.join(root, "proc/self/mountinfo")) as f:
            lines = f.read().splitlines()
    except OSError:
        return None, v1
    for line in lines:
        left, _, right = line.partition(" - ")
        parts, rparts = left.split(), right.split()
        if len(parts) < 5 or len(rparts) < 3:
            continue
        if rparts[0] == "cgroup2" and v2 is None:
            v2 = parts[4]
        elif rparts[0] == "cgroup":
            for opt in rparts[2].split(","):
                v1.setdefault(opt, parts[4])
    return v2, v1


def _self_cgroups(data: bytes | None) -> tuple[str | None, dict[str, str]]:
    """(v2 path, {v1 controller: path}) from /proc/self/cgroup."""
    v2: str | None = None
    v1: dict[str, str] = {}
    for line in (data or b"").decode("utf-8", "replace").splitlines():
        hid, _, rest = line.partition(":")
        ctrls, _, path = rest.partition(":")
        if hid == "0" and ctrls == "":
            v2 = path
        else:
            for c in ctrls.split(","):
                v1[c] = path
    return v2, v1


def _ancestors(path: str) -> list[str]:
    """``/a/b`` -> ["/a/b", "/a", "/"]."""
    out = []
    p = path.rstrip("/") or "/"
    while True:
        out.append(p)
        if p == "/":
            return out
        p = os.path.dirname(p) or "/"


def _read_limit(c: _Collector, path: str) -> int | None | str:
    """A limit file's value: int, None for "max"/no limit, "absent" when it cannot be read."""
    try:
        with open(c.host(path)) as f:
            text = f.read().strip()
    except OSError:
        return "absent"
    if text == "max":
        return None
    if re.fullmatch(r"[0-9]+", text):
        v = int(text)
        return None if v >= _V1_UNLIMITED else v
    return "absent"


def _effective(c: _Collector, mount: str, cg: str, fname: str) -> tuple[int | None, str] | None:
    """The smallest limit along cg's ancestors; None when no level has the file."""
    best: tuple[int | None, str] | None = None
    for level in _ancestors(cg):
        v = _read_limit(c, os.path.join(mount, level.lstrip("/"), fname))
        if isinstance(v, str):  # "absent"
            continue
        if best is None or (v is not None and (best[0] is None or v < best[0])):
            best = (v, level)  # type: ignore[assignment]
    return best


def _collect_cgroup(c: _Collector, hugepage_sizes: list[int]) -> None:
    from umbp_sim.dump.parse import cgroup_hugetlb_name

    v2_path, v1_paths = _self_cgroups(c.read_host("/proc/self/cgroup"))
    v2_mount, v1_mounts = _mountinfo_cgroup(c.root)  # mount points as the host names them
    # Per hugepage size: the fault-time limit and the reservation-time one (v2 rsvd.max, v1
    # rsvd.limit_in_bytes, kernel 5.7+), which is what a MAP_HUGETLB mmap is checked against.
    wanted = [("memory.max", "memory", "memory.limit_in_bytes")] + [
        (f"hugetlb.{name}.{kind}max", "hugetlb", f"hugetlb.{name}.{kind}limit_in_bytes")
        for name in (cgroup_hugetlb_name(s) for s in hugepage_sizes)
        for kind in ("", "rsvd.")
    ]
    for v2_name, ctrl, v1_name in wanted:
        rel = f"sys/fs/cgroup/{v2_name}"
        found = None
        if v2_path is not None and v2_mount is not None:
            found = _effective(c, v2_mount, v2_path, v2_name)
            how = f"cgroup v2 {v2_path}"
        if found is None and ctrl in v1_paths and ctrl in v1_mounts:
            found = _effective(c, v1_mounts[ctrl], v1_paths[ctrl], v1_name)
            how = f"cgroup v1 {ctrl}:{v1_paths[ctrl]} {v1_name}"
        if found is None:
            c.result.missing[rel] = "no such limit file in the current cgroup or its parents"
            continue
        value, level = found
        c.add(rel, b"max\n" if value is None else f"{value}\n".encode())
        c.result.notes.append(f"{rel}: from {how} (binding level {level})")


def collect(out: str, name: str | None = None, root: str = "/") -> CollectResult:
    """Write the dump tarball ``out`` (gzip if it ends in .gz/.tgz, bz2/xz likewise)."""
    name = name or os.uname().nodename or "host"
    if not name or "/" in name or name in (".", ".."):
        raise CollectError(f"--name: {name!r} is not a usable directory name")
    c = _Collector(root, name)
    c.copy("/proc/meminfo")
    c.copy("/proc/zoneinfo")  # the low watermarks: MemAvailable's estimate on old kernels
    for key in (
        "min_free_kbytes",
        "nr_hugepages",
        "nr_overcommit_hugepages",
        "overcommit_memory",
        "overcommit_ratio",
        "overcommit_kbytes",
    ):
        c.copy(f"/proc/sys/vm/{key}")
    if c.copy("/proc/sys/kernel/osrelease") is None and root == "/":
        c.add("proc/sys/kernel/osrelease", (os.uname().release + "\n").encode())
        c.result.missing.pop("proc/sys/kernel/osrelease", None)
        c.result.notes.append("proc/sys/kernel/osrelease: from uname()")
    c.copy("/proc/self/limits")
    c.copy_tree("/sys/kernel/mm/hugepages")
    node = "/sys/devices/system/node"
    for key in ("online", "possible", "has_memory"):
        c.copy(f"{node}/{key}")
    for entry in c.listdir(node):
        if re.fullmatch(r"node\d+", entry):
            for key in ("meminfo", "cpulist", "distance"):
                c.copy(f"{node}/{entry}/{key}")
            c.copy_tree(f"{node}/{entry}/hugepages")
    from umbp_sim.dump.parse import hugepage_dir_size

    hp = c.host("/sys/kernel/mm/hugepages")
    names = os.listdir(hp) if os.path.isdir(hp) else []
    sizes = sorted(s for s in map(hugepage_dir_size, names) if s)
    _collect_cgroup(c, sizes)

    res = c.result
    res.path = out
    manifest = {
        "tool": "umbp-sim collect",
        "name": name,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "collected": sorted(res.collected),
        "files": {rel: len(c.files[rel]) for rel in sorted(c.files)},  # sizes: see dump/manifest.py
        "missing": dict(sorted(res.missing.items())),
        "notes": res.notes,
    }
    c.files[MANIFEST] = (json.dumps(manifest, indent=1) + "\n").encode()
    _write_tar(out, name, c.files)
    return res


def _write_tar(out: str, name: str, files: dict[str, bytes]) -> None:
    mode = "w"
    if out.endswith((".gz", ".tgz")):
        mode = "w:gz"
    elif out.endswith((".bz2", ".tbz2")):
        mode = "w:bz2"
    elif out.endswith((".xz", ".txz")):
        mode = "w:xz"
    buf = io.BytesIO()
    now = int(time.time())
    with tarfile.open(fileobj=buf, mode=mode) as tar:  # type: ignore[call-overload]
        dirs: set[str] = set()
        for rel in sorted(files, key=lambda r: (r != MANIFEST, r)):  # the manifest first
            parts = f"{name}/{rel}".split("/")
            for i in range(1, len(parts)):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, now
                    tar.addfile(info)
            info = tarfile.TarInfo(f"{name}/{rel}")
            info.size, info.mode, info.mtime = len(files[rel]), 0o444, now
            tar.addfile(info, io.BytesIO(files[rel]))
    _write_new(out, buf.getvalue())


def _write_new(out: str, data: bytes) -> None:
    """Write ``out`` through a fresh temporary file beside it, then rename it into place.

    The temporary file is created with O_EXCL (``tempfile.mkstemp``: a random name, 0600), so
    a file or symbolic link planted under a predictable name is never written through; the
    rename replaces ``out`` itself, never what a symbolic link there points to. The final mode
    is 0644 minus the umask, as ``open()`` would have made it.
    """
    directory = os.path.dirname(out) or "."
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(out)}.", dir=directory)
    except OSError as e:
        raise CollectError(f"-o {out}: cannot write: {e.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(f.fileno(), 0o644 & ~umask)
            f.write(data)
        os.replace(tmp, out)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise CollectError(f"-o {out}: cannot write: {e.strerror}") from None
