"""What a dump says, file by file: ``DumpFacts``, and ``parse_dump`` which reads it.

``DumpFacts`` keeps "the dump does not say" (None) apart from 0, so ``inspect`` can print null;
``umbp_sim.dump.to_machine.build_machine`` turns it into a ``Machine`` (which has no unknowns).
Every guess the reader makes is written to ``notes`` in plain words, each with a code
(``umbp_sim.dump.notes``); the rules are:

- arch/page size (``umbp_sim.dump.arch``): the collector's record (``umbp-sim-collect.json``
  ``machine`` and ``page_size``), else the kernel string (osrelease, proc/version, a
  sosreport's uname -a: ``.x86_64``, ``-amd64``, ``.aarch64``, ``.ppc64le``, ``.s390x``,
  ``.i686``...), else proc/cpuinfo (x86 ``vendor_id`` with meminfo or the ``lm`` flag for the
  width, arm ``CPU implementer``, POWER ``cpu : POWERn`` with ``MMU : Hash|Radix``, s390
  ``IBM/S390``, ia64 ``arch : IA-64``), else the hugepage sizes alone
  (docs/kernel-model.md section 8), else x86_64 with 4 KiB pages, said to be assumed. The
  sizes only settle what the architecture leaves open (arm64's granule, ppc64's MMU); a size
  it does not register is noted and kept. An architecture umbp-sim does not model (ia64,
  32-bit arm...) keeps its name and a note says so.
- hugepage sizes: the ``sys/kernel/mm/hugepages/hugepages-<N>kB`` directories; without them,
  the nodes' ``nodeN/hugepages/hugepages-<N>kB``, else meminfo's ``Hugepagesize`` alone, else
  (node files with ``HugePages_*`` lines, no size) the architecture's default size; with none
  of these, none (a kernel without CONFIG_HUGETLB_PAGE).
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
  are there -> 4.15.0 (``Hugetlb:`` is ~4.16); else DEFAULT_KERNEL_VERSION. A paste
  (``umbp_sim.dump.paste``) dates nothing from a line it does not show: without a release
  line its kernel is DEFAULT_KERNEL_VERSION, with the note ``kernel-version-unknown``; nor does
  it lack hugetlb for showing no hugepage line (the architecture's sizes, empty, noted).
- overcommit: ``proc/sys/vm/*``; without them overcommit_memory 0, and overcommit_ratio solved
  from ``CommitLimit = (MemTotal - hugetlb pool) * ratio / 100 + SwapTotal`` when that gives
  an integer, else 50.
"""

from __future__ import annotations

import os

from umbp_sim.dump.dump_error import DumpError
from umbp_sim.dump.host_facts import (
    DEFAULT_KERNEL_VERSION,
    HUGEPAGES,
    NODES,
    DumpFacts,
    GiB,
    GlobalPool,
    KiB,
    MiB,
    NodeFacts,
    NodePool,
    _Reader,
)
from umbp_sim.dump.opener import bytes_source, open_dump
from umbp_sim.dump.parse import parse_meminfo
from umbp_sim.dump.read_pools import (
    _read_global_pools,
    _read_node_pools,
    _read_sizes,
    infer_arch,
    spread,
)
from umbp_sim.dump.read_system import (
    _read_kernel_version,
    _read_limits,
    _read_nodes,
    _read_sysctls,
    _read_watermarks,
    inferred_overcommit_ratio,
)
from umbp_sim.dump.source import DumpSource

__all__ = [
    "DEFAULT_KERNEL_VERSION",
    "HUGEPAGES",
    "NODES",
    "DumpFacts",
    "GiB",
    "GlobalPool",
    "KiB",
    "MiB",
    "NodeFacts",
    "NodePool",
    "infer_arch",
    "inferred_overcommit_ratio",
    "parse_dump",
    "spread",
]


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
    if src.paste:  # an error names the paste line the value came from
        try:
            return _parse_source(src)
        except DumpError as e:
            raise src.at_line(e) from None  # type: ignore[attr-defined]
    return _parse_source(src)


def _parse_source(src: DumpSource) -> DumpFacts:
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
    f = DumpFacts(name=src.name, source=src.label, bare_meminfo=src.bare_meminfo, paste=src.paste)
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
        f.note(
            "page-cache-from-cached",
            "meminfo has no Active(file)/Inactive(file): page cache taken as Cached - Shmem",
        )
    elif "FilePages" in mi:  # node files only (hwloc.py), of a kernel without the file LRU lines
        f.page_cache = max(0, mi["FilePages"] - mi.get("Shmem", 0))
        f.note(
            "page-cache-from-filepages",
            "the nodes' meminfo has no Active(file)/Inactive(file): page cache taken as their "
            f"FilePages - Shmem ({f.page_cache // KiB} kB)",
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
    if src.paste:
        from umbp_sim.dump.paste import paste_unknowns

        paste_unknowns(src, f)
    f.notes.extend(getattr(src, "notes", ()))  # what a sosreport's sos_commands/ gave
    for rel in src.rejected:  # after the reads: a directory dump finds its links as it reads
        code = "hugepage-path-ignored" if "hugepages" in rel else "path-ignored"
        f.note(code, f"ignored {rel}: absolute path, '..' or a link leaving the dump")
    return f
