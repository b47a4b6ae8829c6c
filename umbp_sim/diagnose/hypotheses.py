"""An error line the dump does not reproduce: what the dump cannot show, searched in simulation.

A dump is usually taken after the server restarted; the error line is the one sure evidence of
the moment it failed. mori returns a null handle (sglang's RuntimeError) only when its anonymous
fallback mmap fails too, so on a host whose dump lets the request through, the cause is state a
host dump does not carry: the server process's RLIMIT_AS, overcommit_memory 2 with memory other
processes had committed at that moment. ``search`` tries each such change on the dumped Machine
(one simulated run each, through ``simulate_request``) and keeps those that reproduce the exact
line. Where the kernel's reason for the failed mmap carries the numbers (SimKernel's
``rlimit_as`` and ``commit_limit`` rules), the change is moved to the edge of the rule: the
largest limit, or the least committed memory, that still gives the line, verified by its own
run, and the run just past that edge says what the server would have seen instead. The changes
that do not give the line are kept too, with what they give (a memory cgroup limit kills the
server instead): they answer "could it have been ...". Hugepages others reserved, or files left
in a hugetlbfs mount holding pages, send the allocator to its 4 KiB fallback: each is tried
again under overcommit_memory 2.

``line_hosts`` answers ``replay --error LINE`` without a dump: the same search on a reference
host, plus the host facts a dump would show (RAM + swap below the request).

Every simulation made here is reported (``HypothesisSearch.tried``); none is made to ask a question.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, is_dataclass, replace
from typing import Any

from umbp_sim.diagnose.explain import gib, kernel_causes, pages_needed
from umbp_sim.diagnose.replay_request import Request
from umbp_sim.diagnose.simulate import Simulation, simulate_request
from umbp_sim.dump import DumpFacts
from umbp_sim.machine import Machine
from umbp_sim.vocabulary.backing import HUGETLB_BACKINGS
from umbp_sim.vocabulary.units import format_size, spaced_size

KiB, GiB = 1 << 10, 1 << 30

_LIMITS_AT_START = (
    "the limits the server starts with: its container's (docker inspect: HostConfig.Ulimits; "
    "a pod's runtime), its unit's LimitAS=, a ulimit -v in its start script"
)
_OVERCOMMIT = "proc/sys/vm/overcommit_memory"  # the dump file (a paste's fact name) of the mode
_COMMIT_HISTORY = (
    "Committed_AS and CommitLimit around the time of the failure: a monitoring history "
    "(node_exporter's node_memory_Committed_AS_bytes and node_memory_CommitLimit_bytes), "
    "sar -r, or /proc/meminfo on a server in the same state"
)
_HUGEPAGES_HISTORY = (
    "HugePages_Free and HugePages_Rsvd around the time of the failure (a monitoring history: "
    "node_exporter's node_memory_HugePages_Free and node_memory_HugePages_Rsvd), and which "
    "other processes map hugepages (grep huge /proc/*/numa_maps)"
)
_HUGETLBFS = (
    "grep hugetlbfs /proc/mounts, then ls -la each mount point (/dev/hugepages, DPDK's "
    "--huge-dir): a file there holds its pages until it is removed"
)
_SYSCTL_AT_START = (
    "vm.overcommit_memory, vm.overcommit_ratio and vm.overcommit_kbytes as the server "
    "started: sysctl -a on the host, /etc/sysctl.conf and /etc/sysctl.d/"
)


@dataclass(frozen=True)
class Tried:
    """One simulated change to the host and what the request came to on it."""

    change: str  # what was different, in words
    fields: dict[str, Any]  # the Machine fields it set
    outcome: str  # the run's outcome word
    summary: str  # Simulation.summary(): the outcome and what made it
    reproduces: bool  # the run gives the question: the given line exactly, or the symptom
    asked: str = "error_line"  # the question: "error_line" or "symptom"

    def to_json(self) -> dict[str, Any]:
        return {
            "change": self.change,
            "machine": {k: _plain(v) for k, v in self.fields.items()},
            "outcome": self.outcome,
            "simulated": self.summary,
            f"reproduces_{self.asked}": self.reproduces,
        }


def _plain(value: Any) -> Any:
    """A Machine field's value as JSON data (nodes as dicts)."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return asdict(value) if is_dataclass(value) and not isinstance(value, type) else value


@dataclass(frozen=True)
class Hypothesis:
    """A change the dump cannot show that gives the exact line, verified by simulation."""

    kind: str  # rlimit_as | committed | overcommit_mode | ram | any_host | a ruled-out kind
    cause: str  # what was different when the server failed
    verified: Tried  # the run at the change: it reproduces the line
    beyond: Tried | None  # the run just past the edge: what the server would have seen
    collect: tuple[str, ...]  # what to collect to confirm it
    fix: tuple[str, ...] = ()  # what to change if it is confirmed (a symptom's hidden causes)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "cause": self.cause,
            "verified": self.verified.to_json(),
            "beyond": self.beyond.to_json() if self.beyond else None,
            "collect": list(self.collect),
            "fix": list(self.fix),
        }


@dataclass
class HypothesisSearch:
    hypotheses: list[Hypothesis] = field(default_factory=list)
    ruled_out: list[Tried] = field(default_factory=list)  # changes that do not give the line
    tried: list[Tried] = field(default_factory=list)  # every simulation, in order
    # The question in words: what the host as searched does not give, and what a run that
    # reproduces it gives ("the error line", "the line, exactly"; a symptom's own).
    asked: str = "the error line"
    got: str = "the line, exactly"

    def to_json(self) -> dict[str, Any]:
        return {
            "question": self.asked,
            "hypotheses": [h.to_json() for h in self.hypotheses],
            "ruled_out": [t.to_json() for t in self.ruled_out],
            "simulations": len(self.tried),
        }


class _Searcher:
    def __init__(
        self,
        machine: Machine,
        request: Request,
        profile: str | None,
        shows: str = "the dump shows",
        facts: DumpFacts | None = None,
    ) -> None:
        assert (request.error_line is None) != (request.symptom is None)
        self.machine, self.request, self.profile = machine, request, profile
        self.shows = shows  # how a cause refers to the host searched from
        # A paste's values (PasteFact.name): a figure it does not give is said to be assumed,
        # never "the dump shows 0".
        self.pasted = (
            frozenset(p.name for p in facts.paste_facts) if facts is not None and facts.paste
            else None
        )  # fmt: skip
        self.found = HypothesisSearch()
        if request.symptom is not None:
            self.found.asked = request.symptom.short
            self.found.got = request.symptom.short

    def said(self, fact: str, value: object) -> str:
        """How a cause names the searched host's figure ``fact`` (a dump file, or ``file:key``
        inside meminfo): what the dump shows, or for a paste whether it shows it."""
        if self.pasted is None:
            return f"{self.shows} {value}"
        if fact in self.pasted:
            return f"the paste shows {value}"
        return f"the paste does not show it: taken as {value}"

    def gives(self, run: Simulation) -> bool:
        """Whether ``run`` gives the question: the exact error line, or the symptom."""
        if self.request.symptom is not None:
            return self.request.symptom.seen(run.observed)
        assert self.request.error_line is not None
        return self.request.error_line.matches(run.observed)

    def run(self, change: str, **fields: Any) -> tuple[Tried, Simulation]:
        run = simulate_request(replace(self.machine, **fields), self.request, profile=self.profile)
        asked = "symptom" if self.request.symptom is not None else "error_line"
        tried = Tried(change, fields, run.outcome, run.summary(), self.gives(run), asked)
        self.found.tried.append(tried)
        return tried, run

    def keep(self, kind: str, cause: str, verified: Tried, beyond: Tried | None,
             collect: tuple[str, ...], fix: tuple[str, ...] = ()) -> None:  # fmt: skip
        self.found.hypotheses.append(Hypothesis(kind, cause, verified, beyond, collect, fix))


def _last(run: Simulation, rule: str) -> dict[str, int] | None:
    """The numbers of the last SimKernel reason of ``rule`` in ``run``."""
    for r in reversed(run.observed.reasons):
        if r.rule == rule:
            return dict(r.numbers)
    return None


def _size(n: int) -> str:
    """``n`` bytes for a sentence: "4 GiB (4,294,967,296 bytes)", "2 MiB", "0"."""
    if n == 0:
        return "0"
    if n < GiB:
        return spaced_size(n) if format_size(n).endswith("iB") else f"{n:,} bytes"
    return f"{gib(n)} ({n:,} bytes)"


def _mappings(request: Request) -> tuple[str, str]:
    """How the request's mappings fail, in words: (every mmap it tries, the last one).

    A hugetlb backing falls back to 4 KiB pages when its hugetlb mmap fails, so a null handle
    means both failed; any other backing tries one mmap.
    """
    backing = request.settings()[0]
    if backing in HUGETLB_BACKINGS:
        return "the hugetlb mmap and the 4 KiB-page fallback both fail", "4 KiB-page fallback"
    return "its one mmap fails", f"{backing} mapping"


def _ulimit(limit: int) -> str:
    return f"RLIMIT_AS {limit // KiB} KiB (ulimit -v {limit // KiB})"


def _rlimit_as(s: _Searcher, facts: DumpFacts | None) -> None:
    """The server's RLIMIT_AS: the largest limit that still gives the line."""
    # A limit of 0 fails any mmap (one page would let a request of a page or less through).
    probe, run = s.run("RLIMIT_AS 0 (ulimit -v 0)", rlimit_as=0)
    if not probe.reproduces:
        s.found.ruled_out.append(probe)
        return
    numbers = _last(run, "rlimit_as")
    if numbers is None:  # the line, but not from the limit: keep the probe
        s.keep("rlimit_as", "a small RLIMIT_AS (ulimit -v) on the server", probe, None,
               (_LIMITS_AT_START,))  # fmt: skip
        return
    need = numbers["vm"] + numbers["length"]  # the failed mmap fits from this limit on
    edge = (need - 1) // KiB * KiB  # ulimit -v counts KiB
    verified, _ = s.run(_ulimit(edge), rlimit_as=edge)
    if not verified.reproduces:
        verified, edge = probe, 0
    beyond, _ = s.run(_ulimit(-(-need // KiB) * KiB), rlimit_as=-(-need // KiB) * KiB)
    shown = ""
    if facts is not None and facts.rlimit_as is not None:
        said = facts.rlimit_as if isinstance(facts.rlimit_as, str) else _size(facts.rlimit_as)
        # Credentials are in a dump only from collect --pid, which takes the limits from there.
        whose = (
            "the server's when it was collected (collect --pid), so not what it ran with "
            "when it failed"
            if facts.uid is not None
            else "the collecting process's: collect --pid PID records the server's"
        )
        shown = f" (the dump's proc/self/limits says {said}: {whose})"
    both, _ = _mappings(s.request)
    hugetlb = " (hugetlb too)" if s.request.settings()[0] in HUGETLB_BACKINGS else ""
    before = f"maps {_size(numbers['vm'])} before" if numbers["vm"] else "maps nothing else"
    cause = (
        f"the server's address-space limit (RLIMIT_AS, ulimit -v) left less than "
        f"{_size(numbers['length'])} for the mmap that failed: RLIMIT_AS counts every mapping "
        f"{hugetlb}, so {both} with ENOMEM and alloc returns a null handle. The room is the "
        f"limit less what the server already maps (its VmSize: Python, torch and a GPU "
        f"runtime map tens of GiB); simulated, a process that {before} gives the line with "
        f"any limit up to {edge:,} bytes{shown}"
    )
    s.keep("rlimit_as", cause, verified, beyond, (
        "umbp-sim collect --pid PID of a running server: its /proc/PID/limits "
        "('Max address space'); and what it maps: grep VmSize /proc/PID/status",
        _LIMITS_AT_START,
    ))  # fmt: skip


def _committed(s: _Searcher, first: tuple[str, str, dict[str, Any]] | None = None) -> None:
    """overcommit_memory 2: the least memory other processes had committed that gives the line
    (under the dump's mode 2, or with the mode changed to 2 since), on the host as dumped or
    after ``first`` (kind, change, Machine fields: hugepages others held at the time)."""
    m = s.machine
    changed_mode = m.overcommit_memory != 2
    base: dict[str, Any] = {"overcommit_memory": 2} if changed_mode else {}
    before, kind = "", "overcommit_mode" if changed_mode else "committed"
    if first is not None:
        base |= first[2]
        before, kind = f"{first[1]}, ", f"{first[0]}+{kind}"
    if changed_mode:
        as_dumped, _ = s.run(
            f"{before}vm.overcommit_memory 2 ({s.said(_OVERCOMMIT, m.overcommit_memory)})", **base
        )
        if as_dumped.reproduces:
            s.keep(kind, (
                f"{before}vm.overcommit_memory was 2 when the server failed "
                f"({s.said(_OVERCOMMIT, m.overcommit_memory)}): with the memory committed as it "
                "is, the strict "
                "commit limit refuses the anonymous mapping, so alloc returns a null handle"
            ), as_dumped, None, (_SYSCTL_AT_START, _COMMIT_HISTORY))  # fmt: skip
            return
    full = m.total_memory() + m.swap_total  # more than any CommitLimit of this host
    mode = before + ("vm.overcommit_memory 2 and " if changed_mode else "")
    probe, run = s.run(f"{mode}Committed_AS {_size(full)}", **base, committed_as=full)
    numbers = _last(run, "commit_limit")
    if not probe.reproduces or numbers is None:
        s.found.ruled_out.append(probe)
        return
    page = m.page_size
    own = numbers["committed_as"] - full  # what this run committed before the failed mmap
    least = max(0, numbers["limit"] - numbers["length"] - own)
    least = -(-least // page) * page
    verified, _ = s.run(f"{mode}Committed_AS {_size(least)}", **base, committed_as=least)
    if not verified.reproduces:
        verified, least = probe, full
    beyond = None
    if least >= page:
        beyond, _ = s.run(
            f"{mode}Committed_AS {_size(least - page)}", **base, committed_as=least - page
        )
    dumped = s.said("proc/meminfo:Committed_AS", _size(m.committed_as))
    limit = f"CommitLimit {_size(numbers['commit_limit'])}"
    if numbers["limit"] != numbers["commit_limit"]:
        limit += f" less the reserves, {_size(numbers['limit'])},"
    cause = (
        f"other processes had committed {_size(least)} or more (Committed_AS; {dumped}) under "
        f"overcommit_memory 2: {limit} leaves less than the {_size(numbers['length'])} "
        f"{_mappings(s.request)[1]}, which is refused with ENOMEM, and alloc returns a null "
        "handle"
    )
    if changed_mode:
        cause = (
            f"vm.overcommit_memory was 2 when the server failed "
            f"({s.said(_OVERCOMMIT, m.overcommit_memory)}) and {cause}"
        )
    collect: tuple[str, ...] = (_COMMIT_HISTORY, _SYSCTL_AT_START)
    if first is not None:
        cause = f"{first[1]} (so the allocator falls back to 4 KiB pages), and {cause}"
        collect = (*collect, _HUGETLBFS if first[0] == "hugetlbfs_files" else _HUGEPAGES_HISTORY)
    s.keep(kind, cause, verified, beyond, collect)


def _moment_changes(s: _Searcher) -> list[tuple[str, str, dict[str, Any]]]:
    """Other states of the moment a dump cannot show: (kind, change, Machine fields). Each is
    one run; the usual answer is that it gives something else than the line."""
    m, request = s.machine, s.request
    biggest = max(request.buffer_sizes())
    out: list[tuple[str, str, dict[str, Any]]] = []
    cap = max(m.page_size, biggest // 2 // m.page_size * m.page_size)
    than = (
        "half the buffer"
        if 2 * cap == biggest
        else ("less than the buffer" if cap < biggest else "one page")
    )
    out.append(("memcg", f"a memory cgroup limit (memory.max) of {_size(cap)}, {than}",
                {"memcg_max": cap}))  # fmt: skip
    backing, hugepage_size, _node, _prefault = request.settings()
    if backing in HUGETLB_BACKINGS:
        size = hugepage_size if hugepage_size in m.hugepage_sizes else m.default_hugepage_size
        free = m.pool_free(size) if size else 0
        held = m.hugepages_reserved.get(size, 0) if size else 0
        need = pages_needed(request, size) if size else 0
        if size and free - held >= need:  # the pool had room: others held enough of it
            taken = dict(m.hugepages_reserved)
            taken[size] = free - need + 1
            out.append(("hugepages_taken", (
                f"other processes held {taken[size]} of the {free} free {_size(size)} hugepages "
                f"(HugePages_Rsvd; {s.said('proc/meminfo:HugePages_Rsvd', held)}), leaving "
                f"{need - 1} of the {need} needed"
            ), {"hugepages_reserved": taken}))  # fmt: skip
            files = _held(m, size, need - 1, -1)
            if files is not None:  # in use, not reserved: no process maps them
                out.append(("hugetlbfs_files", (
                    f"files left in a hugetlbfs mount (e.g. /dev/hugepages, DPDK's rte map "
                    f"files) held {files[1]} of the {free} free {_size(size)} hugepages, "
                    f"leaving {need - 1} of the {need} needed"
                ), files[0]))  # fmt: skip
    return out


def _held(m: Machine, size: int, keep: int, node: int) -> tuple[dict[str, Any], int] | None:
    """The Machine fields with the free ``size`` pages cut to ``keep`` (on ``node``, or
    host-wide from the last node back), the pages counted as in use: (fields, pages held)."""
    nodes = [replace(n, hugepages=dict(n.hugepages)) for n in m.nodes]
    held = 0
    left = keep if node >= 0 else keep - sum(
        n.hugepages[size].free_pages() for n in nodes if size in n.hugepages and n.id != node
    )  # fmt: skip
    for n in reversed(nodes):
        if (node >= 0 and n.id != node) or size not in n.hugepages:
            continue
        pool = n.hugepages[size]
        free = pool.free_pages()
        if node < 0:
            others = sum(x.hugepages[size].free_pages() for x in nodes
                         if size in x.hugepages and x.id < n.id)  # fmt: skip
            target = max(0, keep - others)
        else:
            target = max(0, left)
        if free > target:
            held += free - target
            n.hugepages[size] = replace(pool, free=target)
    if held == 0:
        return None
    free_now = sum(n.hugepages[size].free_pages() for n in nodes if size in n.hugepages)
    reserved = {**m.hugepages_reserved}
    if reserved.get(size, 0) > free_now:
        reserved[size] = free_now
    return {"nodes": nodes, "hugepages_reserved": reserved}, held


def _moments(s: _Searcher, baseline: str) -> None:
    """Each state of the moment alone; one that sends the allocator to its 4 KiB-page fallback
    (demoted, where the host as searched was not: ``baseline`` is its outcome) is tried again
    under overcommit_memory 2 (``_committed``): both at once may give the line."""
    for kind, change, fields in _moment_changes(s):
        tried, _ = s.run(change, **fields)
        if tried.reproduces:
            s.keep(kind, change, tried, None, ())
            continue
        s.found.ruled_out.append(tried)
        if tried.outcome == "demoted" and baseline != "demoted":
            _committed(s, (kind, change, fields))


def search(
    machine: Machine,
    facts: DumpFacts | None,
    request: Request,
    baseline: str,
    profile: str | None = None,
) -> HypothesisSearch:
    """The changes a dump cannot show that reproduce ``request.error_line`` on ``machine``,
    most likely first: under the dump's overcommit_memory 2, what others had committed; the
    server's RLIMIT_AS; then overcommit_memory changed to 2 since the failure. ``baseline``:
    the outcome of the request on ``machine`` as dumped (the replay's run).

    A symptom (SIGBUS, an OOM kill, the demotion) instead of an error line is searched by
    ``umbp_sim.diagnose.symptom_causes.symptom_search`` with this module's searcher."""
    assert request.symptom is None, "a symptom's search: symptom_causes.symptom_search"
    s = _Searcher(machine, request, profile, facts=facts)
    if machine.overcommit_memory == 2:
        _committed(s)
        _rlimit_as(s, facts)
    else:
        _rlimit_as(s, facts)
        _committed(s)
    _moments(s, baseline)
    return s.found


# ---- replay --error LINE with no dump ------------------------------------------------------


def reference_host(request: Request) -> Machine:
    """A host on which nothing but the request decides: x86_64, 2 nodes (up to the node the
    request binds to, to node 63) of at least 64 GiB and twice the request each, no hugepages
    reserved, overcommit_memory 0, no limits."""
    total = sum(request.buffer_sizes())
    per_node = max(64 * GiB, -(-2 * total // GiB) * GiB)
    per_node = min(per_node, 1 << 50)  # a request of 2^62 bytes and more fails on any host
    node = request.settings()[2]
    count = node + 1 if 2 <= node < 64 else 2
    return replace(Machine.x86_64(nodes=count, mem_per_node=per_node), name="reference host")


def line_hosts(request: Request, profile: str | None = None) -> tuple[Machine, HypothesisSearch]:
    """The kinds of host on which ``request.error_line`` happens, each verified on a reference
    host (``reference_host``) changed that one way."""
    machine = reference_host(request)
    s = _Searcher(machine, request, profile, "the reference host has")
    as_is, run = s.run("none: the reference host as it is")
    if as_is.reproduces:
        texts = dict.fromkeys(c.text for c in kernel_causes(run.observed.reasons, run))
        why = "; ".join(texts) or (
            "the allocator returns a null handle for this request without any kernel call "
            "failing (simulated on a reference host with memory to spare and no limits)"
        )
        s.keep("any_host", f"on any host: {why}", as_is, None, ())
        return machine, s.found
    s.found.ruled_out.append(as_is)
    total = sum(request.buffer_sizes())
    small = max(GiB, total // 2 // GiB * GiB)
    count = len(machine.nodes)
    nodes = Machine.x86_64(nodes=count, mem_per_node=small // count).nodes
    tried, _ = s.run(f"RAM {_size(small // count * count)}, no swap, overcommit_memory 0",
                     nodes=nodes)  # fmt: skip
    if tried.reproduces:
        cause = (
            "a host whose RAM + swap is smaller than the request: overcommit_memory 0 refuses a "
            "single mapping larger than MemTotal + SwapTotal (ENOMEM)"
            + (", the hugetlb mmap fails or finds no pool,"
               if request.settings()[0] in HUGETLB_BACKINGS else "")
            + " and alloc returns a null handle"
        )  # fmt: skip
        s.keep("ram", cause, tried, None, ("MemTotal, SwapTotal: umbp-sim collect",))
    else:
        s.found.ruled_out.append(tried)
    _rlimit_as(s, None)
    _committed(s)
    _moments(s, as_is.outcome)
    return machine, s.found
