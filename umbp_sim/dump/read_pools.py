"""Reading a dump's hugepage sizes, architecture and pools (global and per node) into
``DumpFacts``; the rules are in ``umbp_sim.dump.facts``'s docstring."""

from __future__ import annotations

from umbp_sim import _native
from umbp_sim.dump.arch import ArchEvidence, ArchReading, read_arch, recorded
from umbp_sim.dump.dump_error import DumpError
from umbp_sim.dump.host_facts import (
    _NODE_DIR_RE,
    HUGEPAGES,
    NODES,
    GlobalPool,
    KiB,
    NodeFacts,
    NodePool,
    _Reader,
)
from umbp_sim.dump.manifest import MANIFEST
from umbp_sim.dump.parse import hugepage_dir_size
from umbp_sim.host.arch_sizes import default_hugepage_sizes, pmd_size


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
        if not r.src.paste:
            f.missing.append(HUGEPAGES)
        sizes = _node_sizes(r)
        if sizes:
            f.note(
                "hugepage-sizes-from-nodes",
                f"no {HUGEPAGES}: the hugepage sizes are the nodes' "
                f"({NODES}/nodeN/hugepages: {', '.join(f'{s // KiB} kB' for s in sizes)})",
            )
    default = mi.get("Hugepagesize")
    if default is not None and (default == 0 or default & (default - 1)):
        raise DumpError(
            where_mi,
            f"Hugepagesize {default // KiB} kB is not a power of two",
            lines.get("Hugepagesize"),
        )
    reading = read_arch(_evidence(r, sorted(set(sizes) | ({default} if default else set()))))
    f.arch, f.page_size, f.arch_modelled, f.mmu = (
        reading.arch, reading.page_size, reading.modelled, reading.mmu
    )  # fmt: skip
    f.note("arch" if reading.modelled else "arch-not-modelled", reading.note)
    if not sizes and default is None and "HugePages_Total" in mi:
        registered = default_hugepage_sizes(f.arch, f.page_size, f.mmu or "radix")
        default = pmd_size(f.arch, f.page_size, registered)
        sizes = [default]
        f.note(
            "hugepage-size-assumed",
            "the paste has HugePages_* lines but no hugepage size: the default size taken as "
            f"{f.arch}'s, {default // KiB} kB (`grep Hugepagesize /proc/meminfo` settles it)"
            if r.src.paste
            else "no hugepage size in the dump, but the nodes' meminfo has HugePages_* lines "
            f"(hugetlb is built in): the default size taken as {f.arch}'s, {default // KiB} kB",
        )
    if not sizes and default is not None:
        sizes = [default]
        f.note(
            "hugepage-size-from-meminfo",
            f"no {HUGEPAGES} directories: the only hugepage size is meminfo's Hugepagesize "
            f"({default // KiB} kB)",
        )
    elif default is not None and default not in sizes:
        sizes.append(default)
        f.note(
            "hugepage-size-added",
            f"meminfo's Hugepagesize {default // KiB} kB has no {HUGEPAGES} directory; added",
        )
    for s in sizes:
        if s <= f.page_size:
            raise DumpError(
                r.src.where(f"{HUGEPAGES}/hugepages-{s // KiB}kB"),
                f"hugepage size {s} is not larger than the {f.page_size}-byte base page",
            )
    f.hugepage_sizes = sorted(set(sizes))
    if default is None and f.hugepage_sizes:
        pmd = pmd_size(f.arch, f.page_size, f.hugepage_sizes)
        default = pmd if pmd in f.hugepage_sizes else f.hugepage_sizes[0]
        f.note(
            "default-hugepage-size-assumed",
            f"meminfo has no Hugepagesize: default hugepage size taken as {default // KiB} kB",
        )
    if r.src.paste and not f.hugepage_sizes:  # never "no hugetlb" from lines not pasted
        default = _paste_sizes(r, default)
    if not f.hugepage_sizes:
        f.note("no-hugetlb", "no hugepage sizes: kernel without CONFIG_HUGETLB_PAGE")
    f.default_hugepage_size = default


def _paste_sizes(r: _Reader, default: int | None) -> int:
    """A paste that shows no hugepage size says nothing about them: the sizes the architecture
    registers are taken as registered, their pools as empty, and a note says so (never "a
    kernel without hugetlb" from lines not pasted). Returns the default size."""
    f = r.facts
    registered = default_hugepage_sizes(f.arch, f.page_size, f.mmu or "radix")
    added = [s for s in registered if s not in f.hugepage_sizes]
    if added:
        f.hugepage_sizes = sorted(set(f.hugepage_sizes) | set(added))
        shown = ", ".join(f"{s // KiB} kB" for s in added)
        f.note(
            "hugepages-assumed",
            f"the paste shows no pool of {shown} pages: taken as {f.arch} registers it, with 0 "
            "pages (`grep -r . /sys/kernel/mm/hugepages` settles it)",
        )
    if default is None:
        default = pmd_size(f.arch, f.page_size, f.hugepage_sizes)
    return default


def _node_sizes(r: _Reader) -> list[int]:
    """The sizes of the ``nodeN/hugepages/hugepages-<N>kB`` directories (a dump without
    ``sys/kernel/mm/hugepages``)."""
    found: set[int] = set()
    for name in r.src.listdir(NODES):
        if _NODE_DIR_RE.match(name):
            for d in r.src.listdir(f"{NODES}/{name}/hugepages"):
                size = hugepage_dir_size(d)
                if size is not None and size & (size - 1) == 0:
                    found.add(size)
    return sorted(found)


def _evidence(r: _Reader, sizes: list[int]) -> ArchEvidence:
    """What the dump says about its architecture (``umbp_sim.dump.arch``)."""
    if r.src.bare_meminfo:
        return ArchEvidence(sizes, meminfo=r.src.read("proc/meminfo"))
    kernel = []
    for rel in ("proc/sys/kernel/osrelease", "proc/version", "sos_commands/kernel/uname_-a"):
        t = _loose(r, rel)
        if t is not None and t.strip():
            kernel.append((t, rel))
    machine, page = recorded(_loose(r, MANIFEST))
    return ArchEvidence(
        sizes,
        cpuinfo=_loose(r, "proc/cpuinfo"),
        meminfo=_loose(r, "proc/meminfo"),
        kernel=kernel,
        recorded_machine=machine,
        recorded_page_size=page,
    )


def _loose(r: _Reader, rel: str) -> str | None:
    """A file's text for weighing evidence: undecodable bytes replaced, never an error (the
    readers that use a file's values report its errors)."""
    data = r.src.read_bytes(rel)
    return None if data is None else data.rstrip(b"\0").decode("utf-8", "replace")


def infer_arch(sizes: list[int], cpuinfo: str | None, meminfo: str | None = None) -> ArchReading:
    """The architecture from the hugepage sizes, proc/cpuinfo and meminfo's text alone
    (``umbp_sim.dump.arch.read_arch`` with no kernel string and no collector record)."""
    return read_arch(ArchEvidence(sizes, cpuinfo=cpuinfo, meminfo=meminfo))


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
                    f.note(
                        "pool-sysfs-meminfo-differ",
                        f"{d}/{k} says {vals[k]}, meminfo {key} says {mi[key]} (read at "
                        "different moments?): the sysfs value is used",
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
    """How the kernel spreads ``count`` pages over ``n`` nodes: round robin, first node first
    (SimKernel's rule, csrc/kernel/sim_rules.h)."""
    return _native.interleave(count, n)


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
                f.note(
                    "pool-spread",
                    f"no per-node files for {size // KiB} kB pages on node(s) "
                    f"{','.join(str(n.id) for n in unknown)}: {rest.total} pages spread round "
                    "robin as the kernel does",
                )
        if f.hugepages[size].source == "nodes":
            pool = f.hugepages[size]
            pool.total = sum(n.hugepages[size].total for n in f.nodes)
            pool.free = sum(n.hugepages[size].free for n in f.nodes)
            pool.surplus = sum(n.hugepages[size].surplus for n in f.nodes)
            f.note(
                "pool-summed-from-nodes",
                f"no global counts for {size // KiB} kB pages: summed from the nodes",
            )
    for node in f.nodes:
        node.__dict__.pop("_meminfo", None)
