"""Why a replayed request came out as it did, in facts read from the dump.

``explain(view, request, run)`` returns plain sentences: the node that does not exist, the pool
counters against the pages needed, MemAvailable against sglang's check, the kernel version
against MADV_POPULATE_WRITE, the cgroup and rlimit limits, and the dump notes that matter.
``HostView`` holds the numbers, read from a fresh SimKernel built from the dump's Machine (the
same counters the simulated /proc and /sys show).
"""

from __future__ import annotations

from dataclasses import dataclass

from umbp_sim.diagnose.request import Request
from umbp_sim.diagnose.run import Run
from umbp_sim.dump import DumpFacts
from umbp_sim.machine import Machine
from umbp_sim.sglang import env as sgenv
from umbp_sim.sglang.sizing import HICACHE_HOST_MEMORY_RESERVE_BYTES, host_memory_budget
from umbp_sim.sim import HugePages, SimHost

GiB = 1 << 30

RDMA_NOTE = (
    "a demoted buffer is on 4 KiB pages: some RDMA NICs cannot register a large region of "
    "4 KiB pages (a per-protection-domain limit of about 4 GiB worth of PTEs was reported), "
    "so the allocation succeeding does not mean the server works"
)


def nodelist(ids: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5`` (the kernel's %*pbl format)."""
    out: list[str] = []
    ids = sorted(set(ids))
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(out) or "none"


def kb(size: int) -> str:
    return f"{size // 1024} kB"


def gib(n: int) -> str:
    return f"{n // GiB} GiB" if n % GiB == 0 else f"{n / GiB:.2f} GiB"


@dataclass
class HostView:
    """The dumped host as the simulation starts it."""

    machine: Machine
    facts: DumpFacts | None
    meminfo: dict[str, int]

    @classmethod
    def of(cls, machine: Machine, facts: DumpFacts | None) -> HostView:
        return cls(machine, facts, SimHost(machine).meminfo())

    def host(self) -> SimHost:
        return SimHost(self.machine)

    def pool(self, size: int) -> HugePages:
        return self.host().hugepages(size)

    def node_pool(self, node: int, size: int) -> HugePages:
        return self.host().node_hugepages(node, size)

    def memory_nodes(self) -> list[int]:
        online = set(self.machine.online())
        return [n.id for n in self.machine.nodes if n.id in online and n.mem_total > 0]

    def node_mem_free(self, node: int) -> int:
        for n in self.machine.nodes:
            if n.id == node:
                return n.mem_free if n.mem_free is not None else n.mem_total
        return 0

    @property
    def kernel(self) -> str:
        return self.machine.kernel_version

    def has_populate_write(self) -> bool:
        return self.machine.kernel_tuple() >= (5, 14, 0)

    def mem_available(self) -> int:
        return self.meminfo.get("MemAvailable", 0) * 1024

    def budget(self) -> int:
        return host_memory_budget(self.meminfo)


def pages_needed(request: Request, size: int) -> int:
    """Hugepages of ``size`` the request maps: each buffer rounded up on its own."""
    return sum(-(-b // size) for b in request.buffer_sizes())


def explain(view: HostView, request: Request, run: Run) -> list[str]:
    causes: list[str] = []
    m = view.machine
    backing, hp, node, prefault = request.settings()
    total_bytes = sum(request.buffer_sizes())

    if request.kind == "sglang":
        try:
            sgenv.parse_env(request.env)
        except sgenv.EnvVarError as e:
            causes.append(str(e))
            return causes + _notes(view, request)
        h = request.hicache()
        budget = view.budget()
        ma = view.mem_available()
        verdict = "fails" if h.nbytes > budget else "passes"
        causes.append(
            f"sglang's host check {verdict}: it needs the {h.nbytes} bytes "
            f"({h.nbytes / 1e9:.2f} GB) to be at most MemAvailable - 10 GiB = {gib(ma)} - 10 GiB "
            f"= {budget / 1e9:.2f} GB"
        )
        default = m.default_hugepage_size
        if default:
            p = view.pool(default)
            if p.total:
                pool_bytes = p.total * default
                fits = pages_needed(request, default) <= p.free - p.reserved
                causes.append(
                    f"MemAvailable excludes the {gib(pool_bytes)} hugetlb pool ({p.total} x "
                    f"{kb(default)} pages, {p.free} free): the check cannot see it"
                    + (", and the request would fit in its free pages" if fits else "")
                )
        if h.nbytes > budget:
            return causes + _notes(view, request)

    if node >= 0:
        possible = m.possible()
        if node not in possible:
            causes.append(
                f"node {node} does not exist: possible nodes are {nodelist(possible)}; the "
                "allocator drops the binding and the buffer lands on any node"
            )
        elif node not in view.memory_nodes():
            causes.append(
                f"node {node} is possible but not online with memory (nodes with memory: "
                f"{nodelist(view.memory_nodes())}): mbind fails with EINVAL and the buffer is "
                "not bound"
            )
    bound = node if node >= 0 and node in view.memory_nodes() else None

    if backing in ("AnonymousHugetlb", "AnonymousShmHugetlb"):
        causes += _hugepage_causes(view, request, run, hp, bound, prefault)
        if run.observed.signal == "SIGKILL" or run.outcome == "failed":
            # The demoted buffer is ordinary memory: it has to fit there too.
            causes += _anonymous_causes(view, total_bytes, bound, prefault, run)
    else:
        causes += _anonymous_causes(view, total_bytes, bound, prefault, run)
    causes += _limit_causes(view, request, hp, total_bytes)
    if run.outcome == "demoted":
        causes.append(RDMA_NOTE)
    return causes + _notes(view, request)


def _hugepage_causes(
    view: HostView, request: Request, run: Run, hp: int, bound: int | None, prefault: bool
) -> list[str]:
    m = view.machine
    out: list[str] = []
    if hp not in m.hugepage_sizes:
        sizes = ", ".join(kb(s) for s in m.hugepage_sizes) or "none"
        out.append(
            f"this kernel has no {kb(hp)} hugepages (sizes: {sizes}): mmap(MAP_HUGETLB) fails "
            "with EINVAL and the allocator falls back to 4 KiB pages"
        )
        return out
    need = pages_needed(request, hp)
    sizes = " + ".join(str(b) for b in request.buffer_sizes())
    out.append(f"{kb(hp)} pages needed: {need} (ceil({sizes} / {hp}))")
    p = view.pool(hp)
    avail = p.free - p.reserved
    out.append(
        f"HugePages_Free {p.free} of {p.total} for {kb(hp)}"
        + (f" ({p.reserved} reserved by other processes: {avail} available)" if p.reserved else "")
    )
    overcommit = m.nr_overcommit_hugepages.get(hp, 0)
    if avail < need:
        more = f"; nr_overcommit_hugepages {overcommit} allows surplus pages" if overcommit else ""
        out.append(
            f"the host is {need - avail} pages short: mmap(MAP_HUGETLB) of {need} pages "
            f"fails with ENOMEM and the allocator falls back to 4 KiB pages{more}"
        )
    elif bound is not None:
        np_ = view.node_pool(bound, hp)
        out.append(f"node {bound} has HugePages_Free {np_.free} of {np_.total} for {kb(hp)}")
        if np_.free < need:
            out.append(
                f"the reservation is global ({avail} pages available on the host), so mmap "
                f"succeeds; the pages are taken from node {bound} at fault time and it has "
                f"{np_.free} of the {need} needed"
            )
            if not prefault:
                out.append(
                    "prefault is off: the allocation returns, and the server is killed by "
                    f"SIGBUS later, when it first touches a page beyond node {bound}'s {np_.free}"
                )
            elif view.has_populate_write():
                out.append(
                    f"kernel {view.kernel} has MADV_POPULATE_WRITE (5.14+): it returns EFAULT, "
                    "the allocator unmaps the buffer and falls back to 4 KiB pages"
                )
            else:
                out.append(
                    f"kernel {view.kernel} is older than 5.14, too old for "
                    "MADV_POPULATE_WRITE (EINVAL): the allocator prefaults by touching one byte "
                    f"per page, and the first touch with no free page on node {bound} is SIGBUS"
                )
    elif prefault and not view.has_populate_write():
        out.append(
            f"kernel {view.kernel} is older than 5.14, too old for MADV_POPULATE_WRITE: the "
            "allocator prefaults by touching (a missing hugepage would be a SIGBUS)"
        )
    if request.settings()[0] == "AnonymousShmHugetlb" and m.kernel_tuple() < (4, 14, 0):
        out.append(
            f"kernel {view.kernel} is older than 4.14: memfd_create rejects MFD_HUGETLB "
            "(EINVAL), so the shm buffer falls back to 4 KiB pages"
        )
    return out


def _anonymous_causes(
    view: HostView, total: int, bound: int | None, prefault: bool, run: Run
) -> list[str]:
    out = []
    oom = run.observed.signal == "SIGKILL" and "memory.max" not in (run.observed.error or "")
    if bound is not None:
        free = view.node_mem_free(bound)
        if free < total:
            out.append(f"node {bound} has {gib(free)} free, the buffer needs {gib(total)} there")
    elif view.mem_available() or view.meminfo.get("MemFree"):
        # Kernels before 3.14 have no MemAvailable: MemFree is what they show.
        label, avail = (
            ("MemAvailable", view.mem_available())
            if view.mem_available()
            else ("MemFree", view.meminfo["MemFree"] * 1024)
        )
        line = f"{label} is {gib(avail)}, the buffer is {gib(total)}"
        if oom and prefault and total > avail:
            line += (
                " on 4 KiB pages: prefaulting it takes more memory than the host has, and the "
                "kernel's OOM killer ends the process (SIGKILL)"
            )
        out.append(line)
    return out


def _limit_causes(view: HostView, request: Request, hp: int, total: int) -> list[str]:
    m = view.machine
    out = []
    if m.memcg_max is not None and m.memcg_max < total and not request.wants_hugepages():
        out.append(
            f"the memory cgroup limit memory.max is {m.memcg_max} bytes, less than the "
            f"{total}-byte buffer: prefaulting it gets the process OOM-killed (SIGKILL)"
        )
    cg = m.hugetlb_cgroup_max.get(hp)
    if cg is not None and request.wants_hugepages() and cg < pages_needed(request, hp) * hp:
        out.append(
            f"the hugetlb cgroup limit for {kb(hp)} pages is {cg} bytes ({cg // hp} pages), "
            f"{pages_needed(request, hp)} needed: enforced at fault time (SIGBUS)"
        )
    if m.rlimit_as is not None and m.rlimit_as < total:
        out.append(
            f"RLIMIT_AS (Max address space) is {m.rlimit_as} bytes, less than the buffer: "
            "mmap fails with ENOMEM"
        )
    if m.overcommit_memory == 2 and not request.wants_hugepages():
        out.append(
            "overcommit_memory is 2 (strict): the mapping must fit under CommitLimit - Committed_AS"
        )
    return out


def _notes(view: HostView, request: Request) -> list[str]:
    """Dump notes that change the answer: guessed kernel version, pools, MemAvailable."""
    if view.facts is None:
        return []
    keys = ["kernel version"]
    if request.wants_hugepages():
        keys += ["pages", "hugepage", "reserved"]
    if request.kind == "sglang":
        keys += ["MemAvailable"]
    return [
        f"dump note: {n}"
        for n in view.facts.notes
        if any(k in n for k in keys) and not n.startswith("page size")
    ]


__all__ = [
    "HICACHE_HOST_MEMORY_RESERVE_BYTES",
    "RDMA_NOTE",
    "HostView",
    "explain",
    "kb",
    "nodelist",
    "pages_needed",
]
