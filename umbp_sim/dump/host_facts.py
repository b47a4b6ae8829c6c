"""The facts a dump gives about a host: ``DumpFacts`` (host-wide), ``NodeFacts``, the hugepage
pools, and ``_Reader``, the optional-file access the readers (``read_pools.py``,
``read_system.py``) fill them through. ``umbp_sim.dump.facts`` re-exports them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from umbp_sim.dump.notes import Note
from umbp_sim.dump.parse import parse_int
from umbp_sim.dump.source import DumpSource

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

DEFAULT_KERNEL_VERSION = "6.18.0"
HUGEPAGES = "sys/kernel/mm/hugepages"
NODES = "sys/devices/system/node"
_NODE_DIR_RE = re.compile(r"^node([0-9]+)$")


@dataclass
class GlobalPool:
    """One hugepage size, host-wide, in pages (sys/kernel/mm/hugepages/hugepages-<N>kB)."""

    total: int = 0
    free: int = 0
    reserved: int = 0
    surplus: int = 0
    overcommit: int | None = None  # nr_overcommit_hugepages; None: not in the dump
    source: str = "sysfs"  # sysfs | meminfo | nodes


@dataclass
class NodePool:
    total: int = 0
    free: int = 0
    surplus: int = 0
    source: str = "sysfs"  # sysfs | meminfo | spread


@dataclass
class NodeFacts:
    id: int
    mem_total: int | None = None  # bytes
    mem_free: int | None = None
    page_cache: int | None = None  # Active(file) + Inactive(file)
    slab_reclaimable: int | None = None
    cpus: str | None = None
    distances: list[int] | None = None
    hugepages: dict[int, NodePool] = field(default_factory=dict)


@dataclass
class DumpFacts:
    """Everything read from one dump; None means the dump does not say."""

    name: str
    source: str
    bare_meminfo: bool = False
    arch: str = "x86_64"
    page_size: int = 4096
    arch_modelled: bool = True  # False: an architecture umbp-sim does not model (a note says)
    mmu: str | None = None  # ppc64's MMU, hash or radix (dump/arch.py)
    hugepage_sizes: list[int] = field(default_factory=list)
    default_hugepage_size: int | None = None
    mem_total: int = 0
    mem_free: int | None = None
    mem_available: int | None = None
    page_cache: int | None = None  # reclaimable file pages: Active(file) + Inactive(file)
    slab_reclaimable: int | None = None  # SReclaimable
    watermark_low: int | None = None  # Σ zones' low watermarks (bytes), from proc/zoneinfo
    commit_limit: int | None = None
    committed_as: int | None = None
    swap_total: int | None = None
    hugepages: dict[int, GlobalPool] = field(default_factory=dict)
    numa_sysfs: bool = False
    nodes: list[NodeFacts] = field(default_factory=list)
    possible_nodes: list[int] | None = None
    online_nodes: list[int] | None = None
    has_memory: list[int] | None = None
    nr_hugepages: int | None = None  # proc/sys/vm/nr_hugepages
    overcommit_memory: int | None = None
    overcommit_ratio: int | None = None
    overcommit_kbytes: int | None = None
    kernel_version: str = DEFAULT_KERNEL_VERSION
    kernel_version_source: str = "default"  # osrelease | proc/version | meminfo | default
    rlimit_as: int | str | None = None  # bytes, "unlimited", or None (no proc/self/limits)
    # proc/self/status's credentials (collect --pid: the server's): CAP_SYS_ADMIN in CapEff,
    # and the effective uid; None: the dump does not say.
    root: bool | None = None
    uid: int | None = None
    memcg_max: int | str | None = None  # bytes, "max", or None (no memory.max)
    hugetlb_cgroup_max: dict[int, int | str] = field(default_factory=dict)
    hugetlb_cgroup_rsvd_max: dict[int, int | str] = field(default_factory=dict)
    # pages held by files left in hugetlbfs mounts (the collectors' listing), per size
    hugetlbfs_held: dict[int, int] = field(default_factory=dict)
    admin_reserve_kbytes: int | None = None
    user_reserve_kbytes: int | None = None
    notes: list[Note] = field(default_factory=list)  # each with its code (dump/notes.py)
    missing: list[str] = field(default_factory=list)  # optional files the dump lacks
    meminfo_source: str = "proc/meminfo"  # or "nodes": summed from nodeN/meminfo (hwloc.py)
    # A paste (dump/paste.py): what it does not show is unknown, never read from a missing line.
    # ``paste_facts``: each value with its paste line; ``paste_unread``: the lines not read.
    paste: bool = False
    paste_facts: list[Any] = field(default_factory=list)
    paste_unread: list[Any] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The ``inspect --json`` document (issue 3), then extra keys."""
        doc: dict[str, Any] = {
            "page_size": self.page_size,
            "default_hugepage_size": self.default_hugepage_size,
            "mem_total": self.mem_total,
            "mem_available": self.mem_available,
            "commit_limit": self.commit_limit,
            "committed_as": self.committed_as,
            "hugepages": {
                str(size): {
                    "total": p.total,
                    "free": p.free,
                    "reserved": p.reserved,
                    "surplus": p.surplus,
                }
                for size, p in sorted(self.hugepages.items())
            },
            "nodes": [
                {
                    "id": n.id,
                    "mem_total": n.mem_total,
                    "mem_free": n.mem_free,
                    "hugepages": {
                        str(size): {"total": p.total, "free": p.free, "surplus": p.surplus}
                        for size, p in sorted(n.hugepages.items())
                    },
                }
                for n in self.nodes
            ],
        }
        doc.update(
            {
                "name": self.name,
                "arch": self.arch,
                "kernel_version": self.kernel_version,
                "kernel_version_source": self.kernel_version_source,
                "hugepage_sizes": sorted(self.hugepage_sizes),
                "mem_free": self.mem_free,
                "swap_total": self.swap_total,
                "possible_nodes": self.possible_nodes,
                "online_nodes": self.online_nodes,
                "has_memory": self.has_memory,
                "overcommit_memory": self.overcommit_memory,
                "overcommit_ratio": self.overcommit_ratio,
                "overcommit_kbytes": self.overcommit_kbytes,
                "nr_overcommit_hugepages": {
                    str(s): p.overcommit for s, p in sorted(self.hugepages.items())
                },
                "rlimit_as": self.rlimit_as,
                "root": self.root,
                "uid": self.uid,
                "memcg_max": self.memcg_max,
                "hugetlb_cgroup_max": {
                    str(s): v for s, v in sorted(self.hugetlb_cgroup_max.items())
                },
                "hugetlb_cgroup_rsvd_max": {
                    str(s): v for s, v in sorted(self.hugetlb_cgroup_rsvd_max.items())
                },
                "notes": list(self.notes),
                "note_codes": [n.code for n in self.notes],  # beside the texts, in order
                "missing": list(self.missing),
                "meminfo_source": self.meminfo_source,
            }
        )
        if self.paste:
            doc["paste"] = {
                "facts": [p.to_json() for p in self.paste_facts],
                "unread": [u.to_json() for u in self.paste_unread],
            }
        return doc

    def note(self, code: str, text: str) -> None:
        """Add the note ``text`` written by the rule ``code`` (umbp_sim/dump/notes.py)."""
        self.notes.append(Note(code, text))


# ---- reading --------------------------------------------------------------------------------


class _Reader:
    """Optional-file access that records what is missing."""

    def __init__(self, src: DumpSource, facts: DumpFacts) -> None:
        self.src = src
        self.facts = facts

    def text(self, rel: str, record: bool = True) -> str | None:
        t = self.src.read(rel)
        if t is None and record and not (self.src.bare_meminfo or self.src.paste):
            self.facts.missing.append(rel)
        return t

    def int(self, rel: str, record: bool = True) -> int | None:
        t = self.text(rel, record)
        return None if t is None else parse_int(t, self.src.where(rel))
