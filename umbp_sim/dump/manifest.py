"""A dump cut short: the archive against its ``umbp-sim collect`` manifest, in one line.

``collect`` (and the stand-alone ``collect.py``/``collect.sh``) write ``NAME/umbp-sim-collect.json``
as the archive's first member, with ``files``: every file of the dump and its size in bytes
(older manifests have ``collected``: the names only). A copy that lost its end keeps the
manifest, so the reader can say what is missing instead of replaying a different machine::

    host.tar.gz: cut short: 12 of the 57 files its manifest (H/umbp-sim-collect.json) lists
    are not in it: H/sys/devices/system/node/node1/meminfo, ... (and 9 more)

``check_manifest`` runs on a whole scan, ``cut_short_error`` words a scan that broke off (a
truncated gzip/bzip2/xz stream or tar), ``check_dir_manifest`` checks a dump directory (an
archive unpacked, perhaps from a cut copy) the same way: every error is a ``DumpError``
(exit 65) naming the archive or directory.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from umbp_sim.dump.dump_error import DumpError
from umbp_sim.dump.tarscan import Scan

MANIFEST = "umbp-sim-collect.json"
SHOWN = 3  # missing files named in the message


def _manifest_member(scan: Scan) -> str | None:
    """The manifest's member name: at the top or under one NAME/ directory (first found)."""
    for name in sorted(scan.files):
        if name == MANIFEST or (name.endswith("/" + MANIFEST) and name.count("/") == 1):
            return name
    return None


def listed_files(scan: Scan, label: str) -> tuple[str, dict[str, int | None]] | None:
    """(the manifest's member name, {member name: size, or None when the manifest gives no
    size}) from the scan's manifest; None when the archive has none."""
    member = _manifest_member(scan)
    if member is None:
        return None
    return member, _listed(scan.files[member], member[: -len(MANIFEST)], f"{label}:{member}")


def _listed(data: bytes, top: str, where: str) -> dict[str, int | None]:
    try:
        doc: Any = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise DumpError(where, f"not a readable manifest: {str(e)[:80]}") from None
    if not isinstance(doc, dict):
        raise DumpError(where, "not a readable manifest: expected a JSON object")
    files = doc.get("files")
    if isinstance(files, dict):
        if not all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in files.items()):
            raise DumpError(where, "not a readable manifest: 'files' must map names to sizes")
        return {top + k: v for k, v in files.items()}
    collected = doc.get("collected")
    if isinstance(collected, list) and all(isinstance(k, str) for k in collected):
        return {top + k: None for k in collected}
    return {}  # a manifest without a file list: nothing to check


def _missing_text(missing: list[str], total: int, member: str) -> str:
    shown = ", ".join(missing[:SHOWN])
    more = f" (and {len(missing) - SHOWN} more)" if len(missing) > SHOWN else ""
    return (
        f"{len(missing)} of the {total} files its manifest ({member}) lists are not in it: "
        f"{shown}{more}"
    )


def check_manifest(scan: Scan, label: str) -> None:
    """Raise when the whole archive lacks a file its manifest lists, or holds one of another
    size; silent without a manifest."""
    found = listed_files(scan, label)
    if found is None:
        return
    member, listed = found
    missing = [name for name in sorted(listed) if name not in scan.sizes]
    if missing:
        raise DumpError(
            label, f"cut short: {_missing_text(missing, len(listed), member)}", kind="missing"
        )
    for name, size in sorted(listed.items()):
        if size is not None and scan.sizes[name] != size:
            raise DumpError(
                label,
                f"{name} is {scan.sizes[name]} bytes, its manifest ({member}) says {size}: "
                "the archive is not the one collect wrote",
            )


def cut_short_error(label: str, reason: str, partial: Scan | None) -> DumpError:
    """The error for a scan that broke off early: what ended where, and which of the
    manifest's files (when the manifest came before the cut) never arrived."""
    found = None
    if partial is not None:
        try:
            found = listed_files(partial, label)
        except DumpError:
            found = None  # the cut is the news; a manifest cut inside says nothing more
    if found is None or not found[1]:
        what = "the files after that point are missing"
    else:
        member, listed = found
        missing = [name for name in sorted(listed) if name not in partial.sizes]  # type: ignore[union-attr]
        what = _missing_text(missing, len(listed), member) if missing else "no listed file lost"
    return DumpError(label, f"cut short: {reason}; {what}", kind="unreadable")


MAX_LISTED = 10_000  # files a directory's manifest may ask to check (collect writes ~100-2000)


def check_dir_manifest(
    read: Callable[[str], bytes | None], name: Callable[[str], str], label: str
) -> None:
    """For a dump directory with a manifest: raise when a listed file is missing or of another
    size. ``read(rel)`` gives a file's bytes or None (the directory source's reader: inside the
    dump only, each at most max_file), ``name(rel)`` how an error names it; ``label`` names the
    dump."""
    data = read(MANIFEST)
    if data is None:
        return
    where = name(MANIFEST)
    listed = _listed(data, "", where)
    if len(listed) > MAX_LISTED:
        raise DumpError(where, f"lists {len(listed)} files, more than the {MAX_LISTED} checked")
    missing = []
    for rel, size in sorted(listed.items()):
        got = read(rel) if rel and rel.count("/") < 16 else None
        if got is None:
            missing.append(rel)
        elif size is not None and len(got) != size:
            raise DumpError(
                name(rel),
                f"{len(got)} bytes, its manifest ({where}) says {size}: the dump is not the "
                "one collect wrote",
            )
    if missing:
        raise DumpError(
            label,
            f"cut short: {_missing_text(missing, len(listed), where)}",
            kind="missing",
        )
