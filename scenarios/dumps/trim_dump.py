"""Repack a machine dump with only the files umbp_sim.dump reads, and check it loads the same.

The scenario library loads real dumps from tests/data/machines/; the full tarballs hold
thousands of /sys members the parser skips, and iterating them costs up to a second per
scenario. ``python scenarios/dumps/trim_dump.py SRC.tar.bz2 DST.tar.bz2`` keeps the members
matching ``umbp_sim.dump.source.RELEVANT`` (plus link targets and the directories that
``listdir`` walks) and fails unless ``load_dump`` gives an equal Machine, notes and missing list.
"""

from __future__ import annotations

import io
import posixpath
import sys
import tarfile

from umbp_sim.dump import load_dump
from umbp_sim.dump.source import RELEVANT

LISTED_DIRS = ("sys/kernel/mm/hugepages", "sys/devices/system/node")


def _link_target(m: tarfile.TarInfo) -> str:
    if m.islnk():
        return m.linkname
    return posixpath.normpath(posixpath.join(posixpath.dirname(m.name), m.linkname))


def trim(src: str, dst: str) -> tuple[int, int]:
    with tarfile.open(src, "r:*") as tar:
        members = tar.getmembers()
        prefix = next(
            (m.name[: -len("proc/meminfo")] for m in members if m.name.endswith("proc/meminfo")),
            "",
        )
        keep: set[str] = set()
        for m in members:
            rel = m.name.removeprefix(prefix)
            if (m.isfile() or m.issym() or m.islnk()) and RELEVANT.match(rel):
                keep.add(m.name)
                if m.issym() or m.islnk():
                    keep.add(_link_target(m))
        ancestors: set[str] = set()
        for name in keep:
            d = posixpath.dirname(name)
            while d and d not in ancestors:
                ancestors.add(d)
                d = posixpath.dirname(d)
        out = io.BytesIO()
        kept = 0
        with tarfile.open(fileobj=out, mode="w:bz2") as o:
            for m in members:
                rel = m.name.removeprefix(prefix)
                if m.name in keep or (
                    m.isdir() and (m.name in ancestors or rel.startswith(LISTED_DIRS))
                ):
                    o.addfile(m, tar.extractfile(m) if m.isfile() else None)
                    kept += 1
    with open(dst, "wb") as f:
        f.write(out.getvalue())
    (a, fa), (b, fb) = load_dump(src), load_dump(dst)
    if a != b or fa.notes != fb.notes or fa.missing != fb.missing:
        raise SystemExit(f"{dst}: trimmed dump does not load like {src}")
    return len(members), kept


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: trim_dump.py SRC.tar.bz2 DST.tar.bz2")
    before, after = trim(sys.argv[1], sys.argv[2])
    print(f"{sys.argv[2]}: {before} -> {after} members")
