"""DumpFacts -> Machine: fill what the dump does not say, keep what it does.

Rules (each one that fires adds a line to ``facts.notes``):
- No node directory (s390, i386 dumps): one node 0 with MemTotal/MemFree and the global pools.
- A node without meminfo: the part of MemTotal the other nodes do not account for, split evenly.
- Node pools are the Machine's truth (pages live on nodes). When the nodes' sum differs from the
  global count, the node numbers are kept and the difference is noted. Per node, ``free`` and
  ``surplus`` larger than ``total`` are cut to ``total``; the global reserved count is cut to
  the pages free on the nodes (the kernel keeps resv <= free).
- A node listed in a nodeN directory or in ``online`` but not in ``possible`` is added to
  ``possible``; missing online/possible lists default to the node ids.
- MemAvailable: the dump's line; a meminfo without one (kernels before 3.14) gets the kernel's
  own estimate (si_mem_available: MemFree above the low watermarks, plus page cache and
  SReclaimable less what reclaim cannot free); the low watermarks come from proc/zoneinfo, else
  5/4 of vm.min_free_kbytes, else the kernel's default min_free_kbytes for MemTotal (both
  SimKernel's rules, csrc/kernel/sim_rules.h). The estimate is what a SimKernel of the built
  Machine starts with (``umbp_sim.sim.start_numbers``), so a dump without MemFree gets the
  MemFree the simulated host starts with, and the note, the simulated /proc/meminfo and
  sglang's reading are one number.
- Node MemTotal figures that do not add up to MemTotal are noted (the nodes' figures are used
  for the nodes, MemTotal for CommitLimit and the host-wide lines).
- overcommit_memory 0, overcommit_ratio solved from CommitLimit (else 50) and overcommit_kbytes
  0 when the sysctl files are absent; RLIMIT_AS and memory.max absent or unlimited -> None.
"""

from __future__ import annotations

from umbp_sim import _native
from umbp_sim.dump.dump_error import DumpError
from umbp_sim.dump.facts import DumpFacts, inferred_overcommit_ratio
from umbp_sim.dump.notes import Note
from umbp_sim.machine import MACHINE_FIELDS, GiB, HugePool, Machine, MachineError, Node
from umbp_sim.sim import start_numbers


def build_machine(f: DumpFacts) -> Machine:
    nodes = _nodes(f)
    node_ids = [n.id for n in nodes]
    possible = sorted(set(f.possible_nodes or []) | set(node_ids) | set(f.online_nodes or []))
    if f.possible_nodes is not None and possible != f.possible_nodes:
        f.note(
            "possible-nodes-extended",
            f"possible nodes {f.possible_nodes} do not include all nodes/online nodes: "
            f"using {possible}",
        )
    online = f.online_nodes if f.online_nodes is not None else None

    reserved: dict[int, int] = {}
    overcommit: dict[int, int] = {}
    for size, pool in f.hugepages.items():
        node_total = sum(n.hugepages.get(size, HugePool()).total for n in nodes)
        node_free = sum(n.hugepages.get(size, HugePool()).free_pages() for n in nodes)
        if f.nodes and node_total != pool.total:
            f.note(
                "pool-nodes-differ-global",
                f"{size // 1024} kB pages: nodes hold {node_total}, the global count is "
                f"{pool.total}; the simulation uses the nodes' pages",
            )
        resv = pool.reserved
        if resv > node_free:
            f.note(
                "reserved-cut",
                f"{size // 1024} kB pages: {resv} reserved but {node_free} free; reserved "
                f"cut to {node_free}",
            )
            resv = node_free
        if resv:
            reserved[size] = resv
        if pool.overcommit:
            overcommit[size] = pool.overcommit

    ratio = f.overcommit_ratio
    if ratio is None:
        ratio = inferred_overcommit_ratio(f) if not f.overcommit_kbytes else None
        if ratio is not None:
            f.note("overcommit-ratio-solved", f"overcommit_ratio {ratio}: solved from CommitLimit")
        else:
            ratio = 50
            f.note(
                "overcommit-ratio-default",
                "overcommit_ratio 50: the kernel default (not in the dump)",
            )
    if f.overcommit_memory is None:
        f.note(
            "overcommit-memory-default", "overcommit_memory 0: the kernel default (not in the dump)"
        )

    watermark_low = f.watermark_low
    estimate_at = None  # where the MemAvailable estimate's note goes, once the Machine is built
    if f.mem_available is None:
        if watermark_low is None:
            watermark_low = _native.default_watermark_low(f.mem_total)
            wm_from = f"the kernel's default for {f.mem_total // GiB} GiB (no proc/zoneinfo)"
        else:
            wm_from = "proc/zoneinfo" if "proc/zoneinfo" not in f.missing else "min_free_kbytes"
        estimate_at = len(f.notes)
    known_totals = [n.mem_total for n in f.nodes if n.mem_total is not None]
    if f.nodes and len(known_totals) == len(f.nodes):
        node_sum = sum(known_totals)
        if abs(node_sum - f.mem_total) > max(f.mem_total // 100, 64 << 20):
            f.note(
                "node-memtotal-mismatch",
                f"the nodes' MemTotal add up to {node_sum // 1024} kB, meminfo's MemTotal is "
                f"{f.mem_total // 1024} kB: per-node memory follows the nodes' files, CommitLimit "
                "and the host-wide lines follow MemTotal",
            )

    m = Machine(
        arch=f.arch,
        page_size=f.page_size,
        hugepage_sizes=sorted(f.hugepage_sizes),
        default_hugepage_size=f.default_hugepage_size,
        nodes=nodes,
        possible_nodes=possible if (f.possible_nodes is not None or online is not None) else None,
        online_nodes=online,
        numa_sysfs=f.numa_sysfs,
        hugepages_reserved=reserved,
        nr_overcommit_hugepages=overcommit,
        overcommit_memory=f.overcommit_memory or 0,
        overcommit_ratio=ratio,
        overcommit_kbytes=f.overcommit_kbytes or 0,
        swap_total=f.swap_total or 0,
        mem_total=f.mem_total,
        mem_free=f.mem_free,
        mem_available=f.mem_available,
        # A node-only dump cannot say whether /proc/meminfo had the line: shown (3.14+ and
        # RHEL 7's 3.10 have it), with the estimate, and said in a note.
        mem_available_line=f.mem_available is not None or f.meminfo_source == "nodes" or f.paste,
        page_cache=f.page_cache or 0,
        slab_reclaimable=f.slab_reclaimable or 0,
        watermark_low=watermark_low,
        committed_as=f.committed_as or 0,
        rlimit_as=f.rlimit_as if isinstance(f.rlimit_as, int) else None,
        root=f.root if f.root is not None else True,
        memcg_max=f.memcg_max if isinstance(f.memcg_max, int) else None,
        hugetlb_cgroup_max=_limits(f.hugetlb_cgroup_max),
        hugetlb_cgroup_rsvd_max=_limits(f.hugetlb_cgroup_rsvd_max),
        kernel_version=f.kernel_version,
        name=f.name,
    )
    for key in ("admin_reserve_kbytes", "user_reserve_kbytes"):
        if getattr(f, key) is not None:
            setattr(m, key, getattr(f, key))
        else:
            f.note(
                "reserve-default", f"{key} {getattr(m, key)}: the kernel default (not in the dump)"
            )
    if f.root is None and not any(n.code == "credentials-unreadable" for n in f.notes):
        f.note(
            "credentials-unknown",
            "the server's credentials are not in the dump (umbp-sim collect --pid PID records "
            "them): taken as privileged (CAP_SYS_ADMIN, CAP_SYS_NICE)",
        )
    for spec in MACHINE_FIELDS:
        if spec.dump is None:
            f.note(
                "field-not-in-dump",
                f"{spec.name} = {spec.default!r}: not in a dump, the default ({spec.doc})",
            )
    try:
        if estimate_at is not None:  # SimKernel's estimate, of a Machine that validates
            f.notes.insert(
                estimate_at, Note("mem-available-estimated", _estimate_mem_available(f, m, wm_from))
            )
        return m.validate()
    except MachineError as e:  # a rule above missed a case: still the dump's fault
        raise DumpError(f.source, f"inconsistent dump: {e}") from None


def _estimate_mem_available(f: DumpFacts, m: Machine, wm_from: str) -> str:
    """Set ``m.mem_available`` to what a SimKernel of ``m`` starts with (its si_mem_available:
    one rule, so the note, the simulated /proc/meminfo and what sglang reads agree) and return
    the note that says how."""
    start = start_numbers(m)
    free = start.mem_free
    m.mem_available = start.mem_available
    why = (
        "no proc/meminfo, so no MemAvailable"
        if f.meminfo_source == "nodes"
        else "the paste has no MemAvailable line"
        if f.paste
        else "meminfo has no MemAvailable (a kernel before 3.14 without the backport)"
    )
    free_from = (
        ""
        if f.mem_free is not None
        else " (not in the dump: the nodes' MemTotal less their hugepage pools, page cache and "
        "SReclaimable)"
    )
    return (
        f"{why}: estimated as the kernel does "
        f"(si_mem_available) at {m.mem_available // 1024} kB from MemFree {free // 1024} kB"
        f"{free_from}, page cache {m.page_cache // 1024} kB, SReclaimable "
        f"{m.slab_reclaimable // 1024} kB and low watermarks "
        f"{(m.watermark_low or 0) // 1024} kB ({wm_from})"
        + (
            "; the simulated /proc/meminfo shows it as its MemAvailable line (whether the "
            "host's had one is not in the dump: 3.14+ and RHEL 7's 3.10 have it)"
            if f.meminfo_source == "nodes" or f.paste
            else ""
        )
    )


def _limits(table: dict[int, int | str]) -> dict[int, int]:
    """The sizes with a limit (a number); "max" is no limit."""
    return {s: v for s, v in table.items() if isinstance(v, int)}


def _nodes(f: DumpFacts) -> list[Node]:
    if not f.nodes:
        return [
            Node(
                0,
                f.mem_total,
                f.mem_free,
                hugepages={
                    s: _pool(p.total, p.free, p.surplus, f, f"{s // 1024} kB (global)")
                    for s, p in f.hugepages.items()
                },
            )
        ]
    known = sum(n.mem_total for n in f.nodes if n.mem_total is not None)
    unknown = [n for n in f.nodes if n.mem_total is None]
    share = max(0, f.mem_total - known) // len(unknown) if unknown else 0
    if unknown:
        f.note(
            "node-meminfo-missing",
            f"no meminfo for node(s) {','.join(str(n.id) for n in unknown)}: each given "
            f"{share} bytes of the MemTotal the other nodes do not hold",
        )
    out = []
    for n in f.nodes:
        out.append(
            Node(
                n.id,
                n.mem_total if n.mem_total is not None else share,
                n.mem_free,
                page_cache=n.page_cache,
                slab_reclaimable=n.slab_reclaimable,
                cpus=n.cpus or "",
                distances=n.distances,
                hugepages={
                    s: _pool(p.total, p.free, p.surplus, f, f"node {n.id} {s // 1024} kB")
                    for s, p in n.hugepages.items()
                },
            )
        )
    return out


def _pool(total: int, free: int, surplus: int, f: DumpFacts, what: str) -> HugePool:
    if free > total or surplus > total:
        f.note(
            "pool-counts-cut",
            f"{what}: free {free} / surplus {surplus} exceed total {total}; cut to {total}",
        )
    return HugePool(total, min(free, total), min(surplus, total))
