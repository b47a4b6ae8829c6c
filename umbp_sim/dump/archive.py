"""A dump in a (compressed) tarball: scanned once in memory, never extracted, only the members
a parser may read kept (``tarscan``, bounded by ``limits.ArchiveLimits``), checked against its
collect manifest, served as a ``MemorySource``.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable

from umbp_sim.dump.dump_error import DumpError
from umbp_sim.dump.hwloc import marker_top, must_gather_nodes
from umbp_sim.dump.limits import DEFAULT_LIMITS, ArchiveLimits, Budget
from umbp_sim.dump.manifest import check_manifest, cut_short_error
from umbp_sim.dump.source import (
    LINK_LEAVES,
    MAX_LINK_HOPS,
    MAX_REL_DEPTH,
    MAX_REL_LEN,
    NOT_A_DUMP,
    MemorySource,
    relevant,
)
from umbp_sim.dump.tarscan import Input, TarFormatError, scan

TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tbz", ".tar.xz", ".txz")


def _safe_member_name(name: str) -> str | None:
    name = name.replace("\\", "/")
    while name.startswith("./"):
        name = name[2:]
    name = name.rstrip("/")
    if not name or name.startswith("/") or ".." in name.split("/"):
        return None
    return posixpath.normpath(name)


def _find_prefix(names: set[str], label: str) -> str:
    """The dump's top directory (``NAME/``, or ``""``): where proc/meminfo, or failing that a
    nodeN/meminfo (``hwloc.marker_top``), is."""
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
    return MemorySource(files, label, prefix.rstrip("/") or stem(label), prefix, dirs, rejected)


def stem(label: str) -> str:
    base = os.path.basename(label)
    for suffix in TAR_SUFFIXES:
        if base.endswith(suffix):
            return base[: -len(suffix)]
    return base or "dump"
