"""What a dump says, file by file: ``DumpFacts``, and ``parse_dump`` which reads it.

``DumpFacts`` keeps "the dump does not say" (None) apart from 0, so ``inspect`` can print null;
``umbp_sim.dump.build.build_machine`` turns it into a ``Machine`` (which has no unknowns).
Every guess the reader makes is written to ``notes`` in plain words; the rules are:

- arch/page size (``infer_arch``): hugepage sizes first, they are per-architecture and per base
  page (kernel-model.md section 8): 64kB -> arm64 with 4 KiB pages (4K granule: 64K/2M/32M/1G);
  32768kB without 64kB -> arm64 16 KiB; 524288kB or 16777216kB -> arm64 64 KiB; only 1024kB ->
  s390x 4 KiB; otherwise (2M/1G or none) proc/cpuinfo decides (vendor_id Intel/AMD -> x86_64, or
  i386 when meminfo has HighTotal (32-bit kernel) or the flags lack ``lm``; ``IBM/S390`` ->
  s390x; ``CPU implementer`` -> arm64 4 KiB); with neither, x86_64 with 4 KiB pages.
- hugepage sizes: the ``sys/kernel/mm/hugepages/hugepages-<N>kB`` directories; without them,
  meminfo's ``Hugepagesize`` alone; with neither, none (a kernel without CONFIG_HUGETLB_PAGE).
  A meminfo ``Hugepagesize`` missing from the directories is added. Default size: meminfo's
  ``Hugepagesize``; without it, the architecture's PMD size if that size exists, else the
  smallest size.
- global pool per size: the size directory's files; for the default size, missing files fall
  back to meminfo ``HugePages_*`` and ``proc/sys/vm/nr_overcommit_hugepages``; a size with
  neither takes the sum of the nodes (reserved 0).
- node pool per size: ``nodeN/hugepages/hugepages-<N>kB/*``; for the default size, node meminfo
  ``HugePages_*``; with neither, the global pool is spread as the kernel spreads
  ``vm.nr_hugepages`` (round robin over the nodes with memory, lowest id first).
- kernel version: ``proc/sys/kernel/osrelease``; else ``proc/version``; else from meminfo:
  no MemAvailable -> 3.13.0 (MemAvailable is 3.14); no ``Hugetlb:`` line while HugePages_*
  are there -> 4.15.0 (``Hugetlb:`` is ~4.16); else DEFAULT_KERNEL_VERSION.
- overcommit: ``proc/sys/vm/*``; without them overcommit_memory 0, and overcommit_ratio solved
  from ``CommitLimit = (MemTotal - hugetlb pool) * ratio / 100 + SwapTotal`` when that gives
  an integer, else 50.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from umbp_sim.dump.errors import DumpError
from umbp_sim.dump.limits import MAX_BYTES, MAX_INT
from umbp_sim.dump.parse import (
    MAX_NODES,
    cgroup_hugetlb_name,
    hugepage_dir_size,
    parse_cgroup_max,
    parse_cpulist,
    parse_distance,
    parse_int,
    parse_limits,
    parse_meminfo,
    parse_node_meminfo,
    parse_nodelist,
    parse_osrelease,
    parse_proc_version,
)
from umbp_sim.dump.source import DumpSource, bytes_source, open_dump

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
    memcg_max: int | str | None = None  # bytes, "max", or None (no memory.max)
    hugetlb_cgroup_max: dict[int, int | str] = field(default_factory=dict)
    hugetlb_cgroup_rsvd_max: dict[int, int | str] = field(default_factory=dict)
    admin_reserve_kbytes: int | None = None
    user_reserve_kbytes: int | None = None
    notes: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # optional files the dump lacks
    meminfo_source: str = "proc/meminfo"  # or "nodes": summed from nodeN/meminfo (hwloc.py)

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
                "memcg_max": self.memcg_max,
                "hugetlb_cgroup_max": {
                    str(s): v for s, v in sorted(self.hugetlb_cgroup_max.items())
                },
                "hugetlb_cgroup_rsvd_max": {
                    str(s): v for s, v in sorted(self.hugetlb_cgroup_rsvd_max.items())
                },
                "notes": list(self.notes),
                "missing": list(self.missing),
                "meminfo_source": self.meminfo_source,
            }
        )
        return doc

    def to_machine(self):  # -> Machine (lazy import keeps machine.py free of dump imports)
        from umbp_sim.dump.build import build_machine

        return build_machine(self)


# ---- reading --------------------------------------------------------------------------------


class _Reader:
    """Optional-file access that records what is missing."""

    def __init__(self, src: DumpSource, facts: DumpFacts) -> None:
        self.src = src
        self.facts = facts

    def text(self, rel: str, record: bool = True) -> str | None:
        t = self.src.read(rel)
        if t is None and record and not self.src.bare_meminfo:
            self.facts.missing.append(rel)
        return t

    def int(self, rel: str, record: bool = True) -> int | None:
        t = self.text(rel, record)
        return None if t is None else parse_int(t, self.src.where(rel))


def parse_dump(dump: str | os.PathLike[str] | DumpSource | bytes) -> DumpFacts:
    """Read a dump (path, DumpSource, or the bytes of a tarball/meminfo) into DumpFacts."""
    if isinstance(dump, bytes):
        src: DumpSource = bytes_source(dump, "<bytes>")
    elif isinstance(dump, DumpSource):
        src = dump
    else:
        src = open_dump(dump)
        try:
            return parse_dump(src)
        finally:
            src.close()  # a directory dump holds a directory fd
    from umbp_sim.dump.sosreport import with_sos_commands  # sosreports: sos_commands/ too

    src = with_sos_commands(src)
    text = src.read("proc/meminfo")
    where_mi = src.where("proc/meminfo")
    lines: dict[str, int] = {}
    from_nodes = None
    if text is None:  # hwloc/sosreport dumps with only nodeN/meminfo (dump/hwloc.py)
        from umbp_sim.dump.hwloc import meminfo_from_nodes

        from_nodes = meminfo_from_nodes(src)
        mi, where_mi = from_nodes.meminfo, from_nodes.where
    else:
        mi = parse_meminfo(text, where_mi, lines)
    f = DumpFacts(name=src.name, source=src.label, bare_meminfo=src.bare_meminfo)
    if from_nodes is not None:
        f.meminfo_source = "nodes"
        f.missing.append("proc/meminfo")
        f.notes.extend(from_nodes.notes)
    r = _Reader(src, f)
    f.mem_total = mi["MemTotal"]
    f.mem_free = mi.get("MemFree")
    f.mem_available = mi.get("MemAvailable")
    f.commit_limit = mi.get("CommitLimit")
    f.committed_as = mi.get("Committed_AS")
    f.swap_total = mi.get("SwapTotal")
    if "Active(file)" in mi and "Inactive(file)" in mi:
        f.page_cache = mi["Active(file)"] + mi["Inactive(file)"]
    elif "Cached" in mi:
        f.page_cache = max(0, mi["Cached"] - mi.get("Shmem", 0))
        f.notes.append(
            "meminfo has no Active(file)/Inactive(file): page cache taken as Cached - Shmem"
        )
    f.slab_reclaimable = mi.get("SReclaimable")

    _read_sizes(r, mi, lines, where_mi)
    _read_nodes(r)
    _read_global_pools(r, mi)
    _read_node_pools(r, mi)
    _read_sysctls(r, mi)
    _read_kernel_version(r, mi)
    _read_limits(r)
    _read_watermarks(r)
    f.notes.extend(getattr(src, "notes", ()))  # what a sosreport's sos_commands/ gave
    for rel in src.rejected:  # after the reads: a directory dump finds its links as it reads
        f.notes.append(f"ignored {rel}: absolute path, '..' or a link leaving the dump")
    return f


def _read_watermarks(r: _Reader) -> None:
    """Σ of the zones' low watermarks: proc/zoneinfo, else 5/4 of vm.min_free_kbytes."""
    f = r.facts
    if r.src.bare_meminfo:
        return
    t = r.text("proc/zoneinfo", record=False)
    if t is not None:
        pages = sum(
            int(parts[1])
            for parts in (line.split() for line in t.splitlines())
            if len(parts) == 2 and parts[0] == "low" and parts[1].isdigit()
        )
        f.watermark_low = pages * f.page_size
        return
    mfk = r.int("proc/sys/vm/min_free_kbytes", record=False)
    if mfk is not None:
        f.watermark_low = mfk * 1024 * 5 // 4


def _read_sizes(r: _Reader, mi: dict[str, int], lines: dict[str, int], where_mi: str) -> None:
    f = r.facts
    sizes: list[int] = []
    for name in r.src.listdir(HUGEPAGES):
        size = hugepage_dir_size(name)
        if size is None:
            continue
        if size & (size - 1):
            raise DumpError(
                r.src.where(f"{HUGEPAGES}/{name}"), "hugepage size is not a power of two"
            )
        sizes.append(size)
    if not sizes and not r.src.bare_meminfo:
        f.missing.append(HUGEPAGES)
    cpuinfo = r.text("proc/cpuinfo", record=False) if not r.src.bare_meminfo else None
    default = mi.get("Hugepagesize")
    if default is not None and (default == 0 or default & (default - 1)):
        raise DumpError(
            where_mi,
            f"Hugepagesize {default // KiB} kB is not a power of two",
            lines.get("Hugepagesize"),
        )
    f.arch, f.page_size, why = infer_arch(
        sorted(set(sizes) | ({default} if default else set())), cpuinfo, "HighTotal" in mi
    )
    f.notes.append(why)
    if not sizes and default is not None:
        sizes = [default]
        f.notes.append(
            f"no {HUGEPAGES} directories: the only hugepage size is meminfo's Hugepagesize "
            f"({default // KiB} kB)"
        )
    elif default is not None and default not in sizes:
        sizes.append(default)
        f.notes.append(
            f"meminfo's Hugepagesize {default // KiB} kB has no {HUGEPAGES} directory; added"
        )
    for s in sizes:
        if s <= f.page_size:
            raise DumpError(
                r.src.where(f"{HUGEPAGES}/hugepages-{s // KiB}kB"),
                f"hugepage size {s} is not larger than the {f.page_size}-byte base page",
            )
    f.hugepage_sizes = sorted(set(sizes))
    if default is None and f.hugepage_sizes:
        from umbp_sim.machine import pmd_size

        pmd = pmd_size(f.arch, f.page_size)
        default = pmd if pmd in f.hugepage_sizes else f.hugepage_sizes[0]
        f.notes.append(
            f"meminfo has no Hugepagesize: default hugepage size taken as {default // KiB} kB"
        )
    if not f.hugepage_sizes:
        f.notes.append("no hugepage sizes: kernel without CONFIG_HUGETLB_PAGE")
    f.default_hugepage_size = default


def infer_arch(
    sizes: list[int], cpuinfo: str | None, highmem: bool = False
) -> tuple[str, int, str]:
    """(arch, base page size, why) from the hugepage sizes and proc/cpuinfo (module docstring).

    ``highmem``: meminfo has HighTotal, which only 32-bit kernels print.
    """
    kb = {s // KiB for s in sizes}
    if 64 in kb:
        return "arm64", 4 * KiB, "page size 4 KiB, arm64: hugepage size 64 kB (contiguous PTE)"
    if 32768 in kb:
        return "arm64", 16 * KiB, "page size 16 KiB, arm64: hugepage size 32 MiB without 64 kB"
    if kb & {524288, 16777216}:
        return "arm64", 64 * KiB, "page size 64 KiB, arm64: hugepage size 512 MiB or 16 GiB"
    if kb == {1024}:
        return "s390x", 4 * KiB, "page size 4 KiB, s390x: the only hugepage size is 1 MiB"
    if cpuinfo:
        if "IBM/S390" in cpuinfo:
            return "s390x", 4 * KiB, "page size 4 KiB, s390x: proc/cpuinfo says IBM/S390"
        if re.search(r"^CPU implementer", cpuinfo, re.M):
            return "arm64", 4 * KiB, "page size 4 KiB (assumed), arm64: proc/cpuinfo"
        if re.search(r"^vendor_id\s*:\s*(GenuineIntel|AuthenticAMD|HygonGenuine)", cpuinfo, re.M):
            if highmem:
                return "i386", 4 * KiB, "page size 4 KiB, i386: x86 cpuinfo, meminfo has HighTotal"
            flags = re.search(r"^flags\s*:(.*)$", cpuinfo, re.M)
            if flags and "lm" not in flags.group(1).split():
                return "i386", 4 * KiB, "page size 4 KiB, i386: proc/cpuinfo flags lack 'lm'"
            return "x86_64", 4 * KiB, "page size 4 KiB, x86_64: proc/cpuinfo vendor_id"
    if kb:
        return "x86_64", 4 * KiB, "page size 4 KiB, x86_64: hugepage sizes 2 MiB/1 GiB"
    return "x86_64", 4 * KiB, "page size 4 KiB, x86_64: assumed (no hugepage sizes, no cpuinfo)"


def _read_nodes(r: _Reader) -> None:
    f = r.facts
    if r.src.bare_meminfo:
        f.notes.append("a bare meminfo: no NUMA information (one node, node 0, in the Machine)")
        return
    ids = []
    for name in r.src.listdir(NODES):
        m = _NODE_DIR_RE.match(name)
        if m and len(m.group(1)) <= 5:
            nid = int(m.group(1))
            if nid >= MAX_NODES:
                raise DumpError(r.src.where(f"{NODES}/{name}"), f"node id {nid} >= {MAX_NODES}")
            ids.append(nid)
    for key in ("online", "possible", "has_memory"):
        t = r.text(f"{NODES}/{key}")
        if t is not None:
            setattr(
                f,
                key if key == "has_memory" else f"{key}_nodes",
                parse_nodelist(t, r.src.where(f"{NODES}/{key}")),
            )
    f.numa_sysfs = bool(ids) or f.online_nodes is not None or f.possible_nodes is not None
    if not f.numa_sysfs:
        f.notes.append(f"no {NODES}: no NUMA information (one node, node 0, in the Machine)")
        return
    if not ids:
        ids = list(f.online_nodes or f.possible_nodes or [])
        f.notes.append(f"no nodeN directories: nodes taken from the online list {ids}")
    for nid in sorted(ids):
        node = NodeFacts(nid)
        base = f"{NODES}/node{nid}"
        t = r.text(f"{base}/meminfo")
        if t is not None:
            nm = parse_node_meminfo(t, nid, r.src.where(f"{base}/meminfo"))
            node.mem_total = nm.get("MemTotal")
            node.mem_free = nm.get("MemFree")
            if "Active(file)" in nm and "Inactive(file)" in nm:
                node.page_cache = nm["Active(file)"] + nm["Inactive(file)"]
            node.slab_reclaimable = nm.get("SReclaimable")
            node._meminfo = nm  # type: ignore[attr-defined]
        t = r.text(f"{base}/cpulist")
        if t is not None:
            node.cpus = parse_cpulist(t, r.src.where(f"{base}/cpulist"))
        t = r.text(f"{base}/distance")
        if t is not None:
            node.distances = parse_distance(t, r.src.where(f"{base}/distance"))
        f.nodes.append(node)


def _read_global_pools(r: _Reader, mi: dict[str, int]) -> None:
    f = r.facts
    for size in f.hugepage_sizes:
        d = f"{HUGEPAGES}/hugepages-{size // KiB}kB"
        vals = {
            k: r.int(f"{d}/{k}", record=False)
            for k in (
                "nr_hugepages",
                "free_hugepages",
                "resv_hugepages",
                "surplus_hugepages",
                "nr_overcommit_hugepages",
            )
        }
        pool = GlobalPool(source="sysfs")
        if size == f.default_hugepage_size:
            fallback = {
                "nr_hugepages": "HugePages_Total",
                "free_hugepages": "HugePages_Free",
                "resv_hugepages": "HugePages_Rsvd",
                "surplus_hugepages": "HugePages_Surp",
            }
            for k, key in fallback.items():
                if vals[k] is None and key in mi:
                    vals[k] = mi[key]
                    pool.source = "meminfo"
                elif vals[k] is not None and key in mi and mi[key] != vals[k]:
                    f.notes.append(
                        f"{d}/{k} says {vals[k]}, meminfo {key} says {mi[key]} (read at "
                        "different moments?): the sysfs value is used"
                    )
            if vals["nr_overcommit_hugepages"] is None:
                vals["nr_overcommit_hugepages"] = r.int(
                    "proc/sys/vm/nr_overcommit_hugepages", record=False
                )
        if vals["nr_hugepages"] is None:
            pool.source = "nodes"
        pool.total = vals["nr_hugepages"] or 0
        pool.free = vals["free_hugepages"] if vals["free_hugepages"] is not None else pool.total
        pool.reserved = vals["resv_hugepages"] or 0
        pool.surplus = vals["surplus_hugepages"] or 0
        pool.overcommit = vals["nr_overcommit_hugepages"]
        f.hugepages[size] = pool


def spread(count: int, n: int) -> list[int]:
    """How the kernel spreads ``count`` pages over ``n`` nodes: round robin, first node first."""
    return [count // n + (1 if i < count % n else 0) for i in range(n)] if n else []


def _read_node_pools(r: _Reader, mi: dict[str, int]) -> None:
    f = r.facts
    if not f.nodes:
        return
    for size in f.hugepage_sizes:
        unknown: list[NodeFacts] = []
        for node in f.nodes:
            d = f"{NODES}/node{node.id}/hugepages/hugepages-{size // KiB}kB"
            total = r.int(f"{d}/nr_hugepages", record=False)
            free = r.int(f"{d}/free_hugepages", record=False)
            surp = r.int(f"{d}/surplus_hugepages", record=False)
            nm = getattr(node, "_meminfo", {})
            src = "sysfs"
            if size == f.default_hugepage_size:
                if total is None and "HugePages_Total" in nm:
                    total, src = nm["HugePages_Total"], "meminfo"
                if free is None and "HugePages_Free" in nm:
                    free = nm["HugePages_Free"]
                if surp is None and "HugePages_Surp" in nm:
                    surp = nm["HugePages_Surp"]
            if total is None:
                unknown.append(node)
                continue
            node.hugepages[size] = NodePool(total, total if free is None else free, surp or 0, src)
        if unknown:
            pool = f.hugepages[size]
            known = [n for n in f.nodes if size in n.hugepages]
            rest = NodePool(
                max(0, pool.total - sum(n.hugepages[size].total for n in known)),
                max(0, pool.free - sum(n.hugepages[size].free for n in known)),
                max(0, pool.surplus - sum(n.hugepages[size].surplus for n in known)),
            )
            targets = [n for n in unknown if f.has_memory is None or n.id in f.has_memory]
            targets = targets or unknown
            for n in unknown:
                n.hugepages[size] = NodePool(0, 0, 0, "spread")
            for attr in ("total", "free", "surplus"):
                for n, share in zip(
                    targets, spread(getattr(rest, attr), len(targets)), strict=True
                ):
                    setattr(n.hugepages[size], attr, share)
            if rest.total:
                f.notes.append(
                    f"no per-node files for {size // KiB} kB pages on node(s) "
                    f"{','.join(str(n.id) for n in unknown)}: {rest.total} pages spread round "
                    "robin as the kernel does"
                )
        if f.hugepages[size].source == "nodes":
            pool = f.hugepages[size]
            pool.total = sum(n.hugepages[size].total for n in f.nodes)
            pool.free = sum(n.hugepages[size].free for n in f.nodes)
            pool.surplus = sum(n.hugepages[size].surplus for n in f.nodes)
            f.notes.append(f"no global counts for {size // KiB} kB pages: summed from the nodes")
    for node in f.nodes:
        node.__dict__.pop("_meminfo", None)


def _read_sysctls(r: _Reader, mi: dict[str, int]) -> None:
    f = r.facts
    vm = "proc/sys/vm"
    f.nr_hugepages = r.int(f"{vm}/nr_hugepages")
    om = r.int(f"{vm}/overcommit_memory")
    if om is not None and om not in (0, 1, 2):
        raise DumpError(r.src.where(f"{vm}/overcommit_memory"), f"{om} is not 0, 1 or 2", 1)
    f.overcommit_memory = om
    f.overcommit_ratio = r.int(f"{vm}/overcommit_ratio")
    if f.overcommit_ratio is not None and f.overcommit_ratio > MAX_INT:
        raise DumpError(r.src.where(f"{vm}/overcommit_ratio"),
                        f"{f.overcommit_ratio} does not fit the kernel's int", 1)  # fmt: skip
    f.overcommit_kbytes = r.int(f"{vm}/overcommit_kbytes")
    if f.overcommit_kbytes is not None and f.overcommit_kbytes * 1024 >= MAX_BYTES:
        raise DumpError(r.src.where(f"{vm}/overcommit_kbytes"), f"{f.overcommit_kbytes} kB is "
                        "beyond what umbp-sim simulates (below 2^62 bytes)", 1)  # fmt: skip
    r.int(f"{vm}/nr_overcommit_hugepages")  # recorded as missing if absent; read in pools
    f.admin_reserve_kbytes = r.int(f"{vm}/admin_reserve_kbytes", record=False)
    f.user_reserve_kbytes = r.int(f"{vm}/user_reserve_kbytes", record=False)


def inferred_overcommit_ratio(f: DumpFacts) -> int | None:
    """Solve CommitLimit = (MemTotal - hugetlb pool) * ratio / 100 + SwapTotal for ratio."""
    if f.commit_limit is None:
        return None
    pool = sum(p.total * s for s, p in f.hugepages.items())
    ram = f.mem_total - pool
    if ram <= 0:
        return None
    ratio = (f.commit_limit - (f.swap_total or 0)) * 100 / ram
    if ratio < 0 or abs(ratio - round(ratio)) > 0.05:
        return None
    return round(ratio)


def _read_kernel_version(r: _Reader, mi: dict[str, int]) -> None:
    f = r.facts
    t = r.text("proc/sys/kernel/osrelease")
    if t is not None:
        f.kernel_version = parse_osrelease(t, r.src.where("proc/sys/kernel/osrelease"))
        f.kernel_version_source = "osrelease"
        return
    t = r.text("proc/version", record=False) if not r.src.bare_meminfo else None
    if t is not None:
        f.kernel_version = parse_proc_version(t, r.src.where("proc/version"))
        f.kernel_version_source = "proc/version"
        f.notes.append(f"kernel version {f.kernel_version} from proc/version (no osrelease)")
        return
    f.kernel_version_source = "meminfo"
    if f.meminfo_source == "nodes":  # node files date nothing
        f.kernel_version = DEFAULT_KERNEL_VERSION
        f.kernel_version_source = "default"
        why = "no proc/meminfo, osrelease or proc/version dates it: the default"
    elif "MemAvailable" not in mi:
        f.kernel_version = "3.13.0"
        why = "meminfo has no MemAvailable (added in 3.14)"
    elif "HugePages_Total" in mi and "Hugetlb" not in mi:
        f.kernel_version = "4.15.0"
        why = "meminfo has no Hugetlb: line (added in ~4.16)"
    else:
        f.kernel_version = DEFAULT_KERNEL_VERSION
        f.kernel_version_source = "default"
        why = "nothing in the dump dates it: the default"
    f.notes.append(f"kernel version taken as {f.kernel_version}: {why}")


def _read_limits(r: _Reader) -> None:
    f = r.facts
    t = r.text("proc/self/limits")
    if t is not None:
        limits = parse_limits(t, r.src.where("proc/self/limits"))
        if "Max address space" in limits:
            soft = limits["Max address space"][0]
            f.rlimit_as = "unlimited" if soft is None else soft
        else:
            f.notes.append("proc/self/limits has no 'Max address space' line: RLIMIT_AS unknown")
    t = r.text("sys/fs/cgroup/memory.max")
    if t is not None:
        v = parse_cgroup_max(t, r.src.where("sys/fs/cgroup/memory.max"))
        f.memcg_max = "max" if v is None else v
    for size in f.hugepage_sizes:
        for suffix, by_size in (
            ("max", f.hugetlb_cgroup_max),
            ("rsvd.max", f.hugetlb_cgroup_rsvd_max),
        ):
            rel = f"sys/fs/cgroup/hugetlb.{cgroup_hugetlb_name(size)}.{suffix}"
            t = r.text(rel, record=False)
            if t is not None:
                v = parse_cgroup_max(t, r.src.where(rel))
                by_size[size] = "max" if v is None else v
