"""Why a replayed request came out as it did, from the simulation's own evidence.

``explain(run, request, machine, facts)`` returns :class:`Cause` objects, each built from what
the run recorded and nothing re-derived here:

- SimKernel's reasons (``umbp_sim.sim.Reason``): the rule each failing call hit, each simulated
  signal, and the events that decided an outcome (a global hugetlb reservation, surplus pages
  gathered), with the numbers the kernel model compared;
- what sglang's host check read (``RunRecord.budget``: psutil's available memory and its parts);
- the allocator's own warnings (a binding it dropped, a fallback it took);
- the dump's notes that change the answer.

The Linux rules live in SimKernel (C++), measured against the real kernel; this module only
puts their numbers into sentences.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from umbp_sim.diagnose.fix import COMPROMISES
from umbp_sim.diagnose.replay_request import Request
from umbp_sim.diagnose.simulate import Simulation
from umbp_sim.dump import DumpFacts
from umbp_sim.machine import Machine
from umbp_sim.sglang import env as sgenv
from umbp_sim.sglang.sizing import HICACHE_HOST_MEMORY_RESERVE_BYTES
from umbp_sim.sim import Reason, host_view

GiB = 1 << 30

RDMA_NOTE = (
    "a demoted buffer is on {base} pages: some RDMA NICs cannot register a large region of "
    "{base} pages (a per-protection-domain limit of about 4 GiB worth of PTEs was reported), "
    "so the allocation succeeding does not mean the server works"
)


@dataclass(frozen=True)
class Cause:
    """One sentence of the why, and the evidence it rests on.

    ``source``: ``kernel`` (SimKernel reasons, ``rules`` names them), ``sglang`` (its host check
    or env parse), ``allocator`` (a warning it logged), ``host`` (a fact of the host that stops
    the request on its own, met or not: the node it binds to has no memory), ``outcome`` (a
    consequence of the observed outcome) or ``dump`` (a note from reading the dump;
    ``note_code`` is its code, umbp_sim/dump/notes.py).
    """

    text: str
    source: str
    rules: tuple[str, ...] = ()
    note_code: str | None = None


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


def pages_needed(request: Request, size: int) -> int:
    """Hugepages of ``size`` the request maps: each buffer rounded up on its own."""
    return sum(-(-b // size) for b in request.buffer_sizes())


def explain(
    run: Simulation, request: Request, machine: Machine, facts: DumpFacts | None = None
) -> list[Cause]:
    causes: list[Cause] = []
    o = run.observed
    if request.kind == "sglang":
        failure = sgenv.sglang_env_failure(request.env)
        if failure is not None:
            causes.append(Cause(failure.error, "sglang"))
            return causes + _notes(facts, request)
        if o.budget is not None:
            causes += _host_check(run, request, machine)
            if request.hicache().nbytes > o.budget["available"] - HICACHE_HOST_MEMORY_RESERVE_BYTES:
                return causes + _notes(facts, request)
    causes += _allocator_binding(run, request, machine)
    causes += _node_blocker(run, request, machine, causes)
    causes += deciding_first(kernel_causes(o.reasons, run), run)
    if not any(c.source in ("kernel", "allocator") for c in causes) and run.outcome != "ok":
        # The allocator gave up without a kernel failure: its own words are the evidence.
        causes += [Cause(f"the allocator logged: {w}", "allocator") for w in o.warnings]
        if o.error and not o.warnings:
            causes.append(Cause(f"the request ended with: {o.error}", "outcome"))
    if run.outcome == "demoted":
        causes.append(Cause(RDMA_NOTE.format(base=run.base_pages), "outcome"))
    return _once(causes) + _notes(facts, request)


def _once(causes: list[Cause]) -> list[Cause]:
    """Each sentence once: several ranks meeting the same shortage say the same thing."""
    seen: set[str] = set()
    return [c for c in causes if not (c.text in seen or seen.add(c.text))]  # type: ignore[func-returns-value]


# ---- sglang's host check --------------------------------------------------------------------


def _host_check(run: Simulation, request: Request, machine: Machine) -> list[Cause]:
    b = run.observed.budget or {}
    need = request.hicache().nbytes
    avail = b["available"]
    budget = avail - HICACHE_HOST_MEMORY_RESERVE_BYTES
    verdict = "fails" if need > budget else "passes"
    head = (
        f"sglang's host check {verdict}: it needs the {need} bytes ({need / 1e9:.2f} GB) to be "
        "at most "
    )
    if "MemAvailable" in b:
        text = head + f"MemAvailable - 10 GiB = {gib(avail)} - 10 GiB = {budget / 1e9:.2f} GB"
    else:
        parts = [f"MemFree {gib(b.get('MemFree', 0))}"]
        if "Active(file)" in b and "Inactive(file)" in b and "SReclaimable" in b:
            cache = b["Active(file)"] + b["Inactive(file)"]
            parts += [
                f"page cache {gib(cache)}",
                f"SReclaimable {gib(b['SReclaimable'])}",
                f"low watermarks {gib(b['watermark_low'])}",
            ]
        else:
            parts.append(f"Cached {gib(b.get('Cached', 0))}")
        text = (
            head + f"available - 10 GiB = {gib(avail)} - 10 GiB = {budget / 1e9:.2f} GB, where "
            "available is psutil's estimate (this kernel's /proc/meminfo has no MemAvailable) "
            "from " + ", ".join(parts)
        )
    out = [Cause(text, "sglang")]
    size = machine.default_hugepage_size
    if size:
        p = (run.state or host_view(machine).state()).hugepages(size)
        total, free = p.total, p.free
    if size and total:
        what = "MemAvailable" if "MemAvailable" in b else "psutil's estimate"
        out.append(
            Cause(
                f"{what} excludes the {gib(total * size)} hugetlb pool ({total} x "
                f"{kb(size)} pages, {free} free): the check cannot see it",
                "sglang",
            )
        )
    return out


# ---- the allocator's binding ----------------------------------------------------------------


def _allocator_binding(run: Simulation, request: Request, machine: Machine) -> list[Cause]:
    """The allocator's own decision to drop a NUMA binding (its warning is the evidence)."""
    warning = run.unbound_warning
    node = request.settings()[2]
    if run.unbound is None or warning is None or warning[0] != "numa-node-not-possible":
        return []
    return [
        Cause(
            f"node {node} does not exist: possible nodes are {nodelist(machine.possible())}; "
            "the allocator drops the binding and the buffer lands on any node",
            "allocator",
        )
    ]


def _node_blocker(
    run: Simulation, request: Request, machine: Machine, said: list[Cause]
) -> list[Cause]:
    """The node the request binds to cannot hold it: said even when the run failed before the
    binding (a pool short first), since fixing the pool alone would not get the buffer there."""
    node = request.settings()[2]
    if node < 0 or any(c.source == "allocator" and f"node {node} " in c.text for c in said):
        return []
    ids = machine.node_ids()
    if node not in ids:
        text = f"node {node} does not exist: the host's nodes are {nodelist(ids)}"
    elif node not in machine.online():
        text = f"node {node} is offline (online: {nodelist(machine.online())})"
    elif not any(n.id == node and n.mem_total > 0 for n in machine.nodes):
        text = f"node {node} has no memory (a CPU-only or device node)"
    else:
        return []
    return [Cause(text + ": no buffer can be bound there, whatever else changes", "host")]


def blockers_behind(baseline: Simulation, singles: list[Any]) -> list[Cause]:
    """Each condition that would fail the request on its own, not only the one met first:
    what a single change to the host (a pool, a limit, a sysctl) meets once it has removed the
    blocker the replay met, when that is a rule the replay did not meet (SimKernel's reason
    of that run, said once per rule)."""
    said = {r.rule for r in baseline.observed.reasons if r.errno or r.signal}
    out: list[Cause] = []
    for fix in singles:
        run = fix.run
        if run is None or run.outcome not in ("failed", "crashed") or fix.category in COMPROMISES:
            continue
        new = [r for r in run.observed.reasons if (r.errno or r.signal) and r.rule not in said]
        causes = kernel_causes(new[-1:], run) if new else []
        if causes:
            said.add(new[-1].rule)
            step = " ; ".join(fix.commands)
            out.append(
                Cause(f"behind it, once {step}: {causes[0].text}", "kernel", (new[-1].rule,))
            )
    return out


# ---- SimKernel's reasons ----------------------------------------------------------------------


def kernel_causes(reasons: list[Reason], run: Simulation) -> list[Cause]:
    """SimKernel's ``reasons`` as sentences (a shortage met twice is one sentence)."""
    out: list[Cause] = []
    reserved = next((r for r in reasons if r.rule == "hugetlb_reserved"), None)
    last_fault: tuple[Reason, int] | None = None  # the missing-page fault said last, its index
    for r in reasons:
        if r.rule == "hugetlb_fault_no_page" and last_fault and _same_shortage(last_fault[0], r):
            # The same shortage met again (mori: POPULATE_WRITE's EFAULT, then its manual touch's
            # SIGBUS): one sentence, the second consequence appended.
            prev = out[last_fault[1]]
            out[last_fault[1]] = replace(prev, text=f"{prev.text}, then {_fault_end(r)}")
            continue
        text = _sentence(r, reserved, run)
        if text:
            rules: tuple[str, ...] = (r.rule,) if r is not reserved else ()
            if reserved is not None and r.rule == "hugetlb_fault_no_page":
                rules = ("hugetlb_reserved", r.rule)
            if r.rule == "hugetlb_fault_no_page":
                last_fault = (r, len(out))
            out.append(Cause(text, "kernel", rules))
    return out


def deciding_first(causes: list[Cause], run: Simulation) -> list[Cause]:
    """``causes`` with the one the outcome came from first (the rest in the order they
    happened): a crash's signal, a demotion's first hugetlb failure, a failure's last errno. An
    old kernel's MADV_POPULATE EINVAL, say, only sends the allocator to touch by hand: it comes
    after the empty pool that demoted the buffer, or the missing page that killed it. An ok
    run's causes (a dropped binding's) stay in the order they happened."""
    failing = [r for r in run.observed.reasons if r.errno or r.signal]
    if run.outcome == "crashed":
        deciding = [r for r in failing if r.signal]
        rule = deciding[-1].rule if deciding else None
    elif run.outcome == "demoted":
        deciding = [r for r in failing if r.rule.startswith("hugetlb")]
        rule = deciding[0].rule if deciding else None
    elif run.outcome == "failed":
        rule = failing[-1].rule if failing else None
    else:  # ok (a binding dropped, say): as it happened
        return causes
    first = next((i for i, c in enumerate(causes) if rule in c.rules), None)
    if first is None:
        return causes
    return [causes[first], *causes[:first], *causes[first + 1 :]]


def _same_shortage(a: Reason, b: Reason) -> bool:
    keys = ("node", "hugepage_size", "pages_needed", "node_free")
    return all(a.numbers.get(k) == b.numbers.get(k) for k in keys)


def _fault_end(r: Reason) -> str:
    """What a missing hugepage at fault time does to ``r.call``."""
    if r.errno == "EFAULT":
        return f"{r.call} returns EFAULT"
    return f"{r.call} faults on a missing page and the process is killed by SIGBUS"


def _sentence(r: Reason, reserved: Reason | None, run: Simulation) -> str | None:
    n = r.numbers
    kills = {
        "SIGKILL": "the kernel's OOM killer ends the process (SIGKILL)",
        "SIGBUS": "the process is killed by SIGBUS",
    }
    if r.rule == "hugetlb_reserved":
        return None  # said together with the fault it sets up (or not at all when it is fine)
    if r.rule == "hugetlb_fault_no_page":
        hp = kb(n["hugepage_size"])
        node = n["node"]
        head = ""
        if reserved is not None:
            head = (
                f"the reservation is global ({reserved.numbers['available']} pages available on "
                f"the host), so mmap succeeds; "
            )
        text = (
            head + f"the pages are taken from node {node} at fault time and it has "
            f"{n['node_free']} of the {n['pages_needed']} needed ({hp} pages; "
            f"nr_overcommit_hugepages {n['surplus_allowed']}, surplus {n['surplus']})"
        )
        return f"{text}: {_fault_end(r)}"
    if r.rule in ("oom", "memcg_oom"):
        need, got = n["bytes_needed"], n["bytes_faulted"]
        if r.rule == "memcg_oom":
            return (
                f"the memory cgroup limit memory.max is {n['limit']} bytes: {r.call} of "
                f"{need} bytes stops after {got} bytes, and the cgroup's OOM killer ends the "
                "process (SIGKILL)"
            )
        where = (
            f"node {n['node']}"
            if n["node_count"] == 1
            else f"the {n['node_count']} nodes it may use"
        )
        return (
            f"out of memory: {r.call} needs {gib(need)} on {where}, "
            f"which had {gib(n['node_free'])} free and {gib(n['reclaimable'])} of reclaimable "
            f"page cache and slab; after {gib(got)} {kills['SIGKILL']}"
        )
    if r.rule == "hugetlb_cgroup_limit":
        return (
            f"the hugetlb cgroup limit for {kb(n['hugepage_size'])} pages is {n['limit']} bytes "
            f"({n['limit'] // n['hugepage_size']} pages), {n['pages_needed']} needed: enforced at "
            + (
                f"fault time, so {r.call} returns EFAULT"
                if r.errno == "EFAULT"
                else f"fault time, and {kills['SIGBUS']}"
            )
        )
    if r.rule == "hugetlb_reserve":
        return (
            f"{kb(n['hugepage_size'])} pages needed: {n['pages_needed']}; HugePages_Free "
            f"{n['free']}, Rsvd {n['reserved']}: {n['available']} available, "
            f"{n['pages_needed'] - n['available']} short, and nr_overcommit_hugepages "
            f"{n['surplus_allowed']} (surplus {n['surplus']}) allows no more: mmap(MAP_HUGETLB) "
            "fails with ENOMEM"
        )
    if r.rule == "mbind_empty_mask":
        maxnode_rule = _mbind_maxnode(run, n["maxnode"])
        if maxnode_rule is not None:
            return maxnode_rule
    if r.errno or r.signal or r.rule == "hugetlb_surplus_gathered":
        return r.text if r.rule != "arguments" else f"{r.text} ({r.errno})"
    return None


def _mbind_maxnode(run: Simulation, maxnode: int) -> str | None:
    """An mbind EINVAL whose node is beyond the maxnode - 1 bits the kernel reads (``maxnode``:
    the number SimKernel's reason recorded): mori's maxnode rule when maxnode is its mask's bit
    count (docs/deployed-behaviour.md row 4). None when the request's node is not beyond."""
    node = run.request.settings()[2]
    if node < 0 or maxnode == 0 or node < maxnode - 1:
        return None
    nodes = "no node" if maxnode == 1 else f"nodes 0-{maxnode - 2}"
    read = f"maxnode - 1 = {maxnode - 1} bits, {nodes}"
    tail = f"node {node} is outside them, so the mask mbind sees is empty and it fails with EINVAL"
    if maxnode % 64 == 0 and node == maxnode - 1:
        return (
            f"mori passes maxnode = {maxnode} (the bits of its {maxnode // 64}-word node mask) and "
            f"the kernel reads {read}: {tail} (mori's maxnode rule, docs/deployed-behaviour.md "
            "row 4; umbp-sim's allocator passes node + 2 and binds)"
        )
    return f"the allocator passes maxnode = {maxnode} and the kernel reads {read}: {tail}"


# ---- dump notes -------------------------------------------------------------------------------


def _notes(facts: DumpFacts | None, request: Request) -> list[Cause]:
    """Dump notes that change the answer: guessed kernel version, pools, MemAvailable, an
    architecture umbp-sim does not model."""
    if facts is None:
        return []
    codes = set(NOTES_ALWAYS)
    if request.wants_hugepages():
        codes |= NOTES_HUGEPAGES
    if request.settings()[2] >= 0:  # bound to a node: a dump without NUMA files says one node
        codes |= NOTES_NUMA
    return [
        Cause(f"dump note: {n}", "dump", note_code=n.code) for n in facts.notes if n.code in codes
    ]


# The dump notes (their codes: umbp_sim/dump/notes.py) that change an answer: for any request,
# for a hugepage request, and for a request bound to a node.
NOTES_ALWAYS = frozenset(
    {"kernel-version-from-proc-version", "kernel-version-assumed", "mem-available-estimated",
     "node-memtotal-mismatch", "arch-not-modelled", "credentials-unprivileged",
     # what a paste does not show (umbp_sim/dump/paste.py): every assumption, listed
     "kernel-version-unknown", "memory-assumed", "limits-assumed", "paste-repeated",
     "paste-unreadable", "pod-limits-cut", "cgroup-v1-limit"}
)  # fmt: skip
NOTES_HUGEPAGES = frozenset(
    {"hugepage-sizes-from-nodes", "hugepage-size-assumed", "hugepage-size-from-meminfo",
     "hugepage-size-added", "default-hugepage-size-assumed", "no-hugetlb",
     "pool-sysfs-meminfo-differ", "pool-spread", "pool-summed-from-nodes",
     "pool-nodes-differ-global", "reserved-cut", "hugepage-figure-missing",
     "hugepage-path-ignored", "hugepages-assumed", "pool-free-assumed",
     "pool-total-assumed", "pod-no-hugepages", "hugetlbfs-files"}
)  # fmt: skip
NOTES_NUMA = frozenset({"bare-meminfo", "no-numa-sysfs", "paste-nodes-assumed"})


__all__ = [
    "RDMA_NOTE",
    "Cause",
    "deciding_first",
    "explain",
    "gib",
    "kb",
    "kernel_causes",
    "nodelist",
    "pages_needed",
]
