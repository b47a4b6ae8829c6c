"""Dumps without ``proc/meminfo``: the machine from ``sys/devices/system/node/nodeN/meminfo``.

Many ``hwloc-gather-topology`` dumps (and sosreports whose memory plugin did not run) carry
only the per-node files. Their figures are what the kernel counts per node, so the host-wide
figures are their sums:

- MemTotal, MemFree, Active(file), Inactive(file), FilePages, Shmem, SReclaimable: the sum
  over the nodes that print the line (a node without ``MemTotal`` is left to ``build``'s "no
  meminfo" rule); without the file LRU lines (old kernels) the page cache is FilePages - Shmem;
- HugePages_Total/Free/Surp (the default hugepage size): the sum, when every node prints it.

What only ``/proc/meminfo`` says is not invented: each missing figure is a note naming what
stands in for it (MemAvailable is estimated in ``build`` and noted there).

``is_dump_root(src)`` and ``marker_top(name)`` tell a dump's root by either file, for the
directory and tarball readers in ``source``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from umbp_sim.dump.dump_error import DumpError
from umbp_sim.dump.notes import Note
from umbp_sim.dump.parse import MAX_NODES, MAX_VALUE, parse_node_meminfo
from umbp_sim.vocabulary.value_types import MAX_BYTES

NODES = "sys/devices/system/node"
_NODE_DIR = re.compile(r"^node([0-9]{1,5})$")
_NODE_MEMINFO = re.compile(r"^(?:(?P<top>[^/]+)/)?sys/devices/system/node/node[0-9]{1,5}/meminfo$")
_PROC_MEMINFO = re.compile(r"^(?:(?P<top>[^/]+)/)?proc/meminfo$")
SUMMED = ("MemTotal", "MemFree", "Active(file)", "Inactive(file)", "FilePages", "Shmem",
          "SReclaimable")  # fmt: skip
SUMMED_IF_ALL = ("HugePages_Total", "HugePages_Free", "HugePages_Surp")

# /proc/meminfo figures a node-only dump lacks, what stands in for each (MemAvailable is
# estimated, and noted, by build) and the code of the note saying so.
MISSING_FIGURES = (
    ("CommitLimit", "overcommit_ratio cannot be solved from it", "meminfo-figure-missing"),
    ("Committed_AS", "taken as 0", "meminfo-figure-missing"),
    ("SwapTotal", "taken as 0", "meminfo-figure-missing"),
    ("Hugepagesize", "the default hugepage size is inferred", "hugepage-figure-missing"),
    ("HugePages_Rsvd", "sysfs resv_hugepages, else 0", "hugepage-figure-missing"),
)


@dataclass
class NodeMeminfo:
    """Host-wide figures summed from the nodes' meminfo files (the keys ``parse_meminfo``
    gives), with ``where`` naming the first node file and ``notes`` what is summed or missing."""

    meminfo: dict[str, int]
    where: str
    nodes: list[int]
    notes: list[Note] = field(default_factory=list)


def marker_top(name: str) -> str | None:
    """For an archive member name: ``""`` if it marks a dump root at the top, ``"NAME"`` if
    it marks one under ``NAME/``, None if it marks none (``proc/meminfo`` or a node meminfo)."""
    m = _PROC_MEMINFO.match(name) or _NODE_MEMINFO.match(name)
    if m is None:
        return None
    return m.group("top") or ""


def node_ids(src) -> list[int]:  # type: ignore[no-untyped-def]
    """The ``nodeN`` directories of a dump (DumpSource), sorted."""
    ids = []
    for name in src.listdir(NODES):
        m = _NODE_DIR.match(name)
        if m and int(m.group(1)) < MAX_NODES:
            ids.append(int(m.group(1)))
    return sorted(ids)


def is_dump_root(src) -> bool:  # type: ignore[no-untyped-def]
    """Whether a DumpSource's root has ``proc/meminfo`` or a ``nodeN/meminfo``."""
    if src.exists("proc/meminfo"):
        return True
    return any(src.exists(f"{NODES}/node{n}/meminfo") for n in node_ids(src))


def meminfo_from_nodes(src) -> NodeMeminfo:  # type: ignore[no-untyped-def]
    """The host-wide meminfo figures of a dump without ``proc/meminfo``, from its nodes.

    Raises ``DumpError`` (kind ``missing``) naming ``proc/meminfo`` when no node has a meminfo
    file either, and the node file and line for a malformed one.
    """
    parsed: list[tuple[int, dict[str, int]]] = []
    first_where = None
    for nid in node_ids(src):
        rel = f"{NODES}/node{nid}/meminfo"
        text = src.read(rel)
        if text is None:
            continue
        where = src.where(rel)
        first_where = first_where or where
        parsed.append((nid, parse_node_meminfo(text, nid, where)))
    with_total = [nid for nid, nm in parsed if "MemTotal" in nm]
    if not with_total:
        raise DumpError(
            src.where("proc/meminfo"),
            f"missing, and no {NODES}/nodeN/meminfo with a MemTotal line to build the machine from",
            kind="missing",
        )
    mi: dict[str, int] = {}
    for key in SUMMED:
        values = [nm[key] for _, nm in parsed if key in nm]
        if values:
            mi[key] = sum(values)
    for key in SUMMED_IF_ALL:
        if all(key in nm for _, nm in parsed):
            mi[key] = sum(nm[key] for _, nm in parsed)
    for key, value in mi.items():
        if value >= (MAX_BYTES if key in SUMMED else MAX_VALUE):
            shown = f"{value // 1024} kB" if key in SUMMED else str(value)
            raise DumpError(
                src.where(NODES),
                f"the nodes' {key} add up to {shown}, beyond what umbp-sim simulates",
            )
    listed = ",".join(map(str, with_total))
    notes = [
        Note(
            "meminfo-from-nodes",
            f"no proc/meminfo: MemTotal {mi['MemTotal'] // 1024} kB is the sum of node(s) "
            f"{listed}'s MemTotal ({NODES}/nodeN/meminfo); MemFree, page cache and SReclaimable "
            "are summed likewise",
        )
    ]
    notes += [Note(code, f"no proc/meminfo: {key} not in the dump ({instead})")
              for key, instead, code in MISSING_FIGURES]  # fmt: skip
    return NodeMeminfo(mi, first_where or src.where(NODES), [nid for nid, _ in parsed], notes)


_MUST_GATHER_NODE = re.compile(
    r"^(?P<dir>(?:[^/]+/){0,2}nodes/[^/]+)/"
    r"(?:proc/meminfo|sys/devices/system/node/node[0-9]+/meminfo)$"
)


def must_gather_nodes(names) -> list[str]:  # type: ignore[no-untyped-def]
    """The ``nodes/NODE`` directories of a must-gather archive (from its member names)."""
    return sorted({m.group("dir") for m in map(_MUST_GATHER_NODE.match, names) if m})
