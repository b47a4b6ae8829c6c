"""Fixes that search: single changes and their combinations, each re-run in simulation.

A change (:class:`Fix`) is an admin write applied to the fresh simulated host, a changed
Machine (limits, sysctls the simulation reads at start) and/or a changed request (env, flags,
``--hicache-size``), with the exact commands a person would type. Candidate changes come from
the evidence of a run (SimKernel's reasons, what sglang's check read, the allocator's warnings),
never from re-deriving the kernel's rules here.

``propose`` searches:

1. every single candidate from the replay's evidence;
2. every pair of candidates of different kinds (pool + node, size + node, pool + size, ...);
3. for the singles that changed the outcome without getting everything, the candidates from
   *their* run's evidence (a smaller hicache lets the allocation run, which then shows the node
   it does not fit on), paired with them, and one more step from the best such pair;
4. for each set that gets everything, each step removed in turn: a step the rest does without
   (re-simulated) is dropped, and the steps left are described on the host the steps before
   them leave.

Each set is simulated. The report shows the smallest sets that get the request everything it
asks (host-only changes first), then the sets that make it better short of that ("demoted
successes"); a set is left out when a part of it does as well. When nothing helps, ``limit``
names the rule that stands in the way.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from umbp_sim.backing import SHM_BACKINGS
from umbp_sim.diagnose.explain import gib, kb, pages_needed
from umbp_sim.diagnose.request import Request
from umbp_sim.diagnose.run import Run, simulate_request
from umbp_sim.machine import Machine
from umbp_sim.sglang import env as sgenv
from umbp_sim.sglang.sizing import HICACHE_HOST_MEMORY_RESERVE_BYTES, largest_hicache_size_that_fits
from umbp_sim.sim import Reason, SimHost, host_view
from umbp_sim.units import SizeError, parse_size, size_at_most

HostChange = Callable[[SimHost], "str | None"]
RequestChange = Callable[[Request], Request]
MachineChange = Callable[[Machine], Machine]

# Kinds that change what the request asks for (a compromise), as opposed to fixing the host.
COMPROMISES = ("node", "size", "buffer", "hicache", "no-hugepages", "backing")
# Of those, the ones that give up what the buffer is for (hugepages, its size): shown only when
# nothing milder gets the request everything.
HEAVY = ("buffer", "no-hugepages", "backing")
MAX_RUNS = 120  # simulations per diagnosis, a bound on the search


@dataclass
class Fix:
    action: str
    commands: list[str]
    category: str  # pool|node|size|buffer|hicache|env|limits|no-hugepages|backing|combined
    request_change: RequestChange | None = None
    host_changes: list[HostChange] = field(default_factory=list)
    machine_change: MachineChange | None = None
    parts: list[Fix] = field(default_factory=list)  # the singles of a combined fix
    run: Run | None = None
    key: str = ""  # identity for de-duplication (the commands, by default)
    # The action's text on the host the step starts from, where it names that host's numbers
    # ("N free"): a combination's steps are described on the state the steps before leave.
    describe: Callable[[SimHost], str] | None = None
    # The steps whose run this one was read from (its numbers are that host's): with one of
    # them dropped from a combination, the action is said by its commands alone.
    sized_after: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        self.key = self.key or " ; ".join(self.commands)

    @property
    def singles(self) -> list[Fix]:
        return self.parts or [self]

    @property
    def compromises(self) -> int:
        return sum(1 for f in self.singles if f.category in COMPROMISES)

    @property
    def outcome_after(self) -> str:
        return self.run.summary() if self.run else "not run"

    def request(self, base: Request) -> Request:
        return self.request_change(base) if self.request_change else base

    def machine(self, base: Machine) -> Machine:
        return self.machine_change(base.copy()) if self.machine_change else base

    def to_json(self) -> dict[str, object]:
        return {
            "action": self.action,
            "commands": list(self.commands),
            "outcome_after": self.outcome_after,
            "outcome": self.run.outcome if self.run else None,
        }


def combine(fixes: list[Fix]) -> Fix:
    """One fix doing all of ``fixes`` in order (request changes compose, host writes chain)."""
    singles = [s for f in fixes for s in f.singles]
    if len(singles) == 1:
        return singles[0]
    req_changes = [f.request_change for f in singles if f.request_change]
    mach_changes = [f.machine_change for f in singles if f.machine_change]

    def req(r: Request) -> Request:
        for c in req_changes:
            r = c(r)
        return r

    def mach(m: Machine) -> Machine:
        for c in mach_changes:
            m = c(m)
        return m

    return Fix(
        "all of: " + "; ".join(f.action for f in singles),
        [c for f in singles for c in f.commands],
        "combined",
        request_change=req if req_changes else None,
        host_changes=[h for f in singles for h in f.host_changes],
        machine_change=mach if mach_changes else None,
        parts=singles,
    )


# ---- host writes ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PoolWrite:
    """An admin write of a hugepage pool setting (a :data:`HostChange`): ``nr_hugepages`` or
    ``nr_overcommit_hugepages`` of one page size, host-wide or (``node``) one node's."""

    setting: str  # "nr_hugepages" | "nr_overcommit_hugepages"
    size: int
    count: int
    node: int | None = None

    @property
    def target(self) -> tuple[str, int, int | None]:
        """The file written: two writes with one target leave only the last one's value."""
        return (self.setting, self.size, self.node)

    def __call__(self, host: SimHost) -> str | None:
        if self.setting == "nr_overcommit_hugepages":
            try:
                host.set_nr_overcommit_hugepages(self.size, self.count)
            except OSError as e:
                return f"the kernel refused nr_overcommit_hugepages={self.count}: {e.strerror}"
            return None
        node, size, count = self.node, self.size, self.count
        before = host.node_hugepages(node, size) if node is not None else host.hugepages(size)
        try:
            host.set_nr_hugepages(size, count, node)
        except OSError as e:
            return f"the kernel refused nr_hugepages={count}: {e.strerror}"
        after = host.node_hugepages(node, size) if node is not None else host.hugepages(size)
        if after.total < count and after.total >= before.total:
            where = f"node {node}" if node is not None else "the host"
            return f"the kernel made only {after.total} of {count} pages on {where}"
        return None


def _pool_write(size: int, count: int, node: int | None = None) -> HostChange:
    return PoolWrite("nr_hugepages", size, count, node)


def _overcommit_write(size: int, count: int) -> HostChange:
    return PoolWrite("nr_overcommit_hugepages", size, count)


def _pool_command(machine: Machine, size: int, count: int, node: int | None = None) -> str:
    if node is not None:
        return (
            f"echo {count} > /sys/devices/system/node/node{node}/hugepages/"
            f"hugepages-{size // 1024}kB/nr_hugepages"
        )
    if size == machine.default_hugepage_size:
        return f"sysctl -w vm.nr_hugepages={count}"
    return f"echo {count} > /sys/kernel/mm/hugepages/hugepages-{size // 1024}kB/nr_hugepages"


def _overcommit_command(machine: Machine, size: int, count: int) -> str:
    if size == machine.default_hugepage_size:
        return f"sysctl -w vm.nr_overcommit_hugepages={count}"
    return (
        f"echo {count} > /sys/kernel/mm/hugepages/hugepages-{size // 1024}kB/"
        "nr_overcommit_hugepages"
    )


# ---- candidates from a run's evidence ---------------------------------------------------------


def _set_node(node: int) -> RequestChange:
    return lambda r: r.with_node(node)


def _set_hp(size: int) -> RequestChange:
    return lambda r: r.with_hugepage_size(size)


def _set_size(size: int) -> RequestChange:
    return lambda r: r.with_alloc(size=size)


def _set_hicache(gb: int) -> RequestChange:
    return lambda r: r.with_hicache_size(gb)


def _set_env(name: str, value: str) -> RequestChange:
    return lambda r: r.with_env(**{name: value})


def _no_hugepages(r: Request) -> Request:
    return r.without_hugepages()


def candidates(
    machine: Machine, request: Request, run: Run, host: SimHost | None = None
) -> list[Fix]:
    """Single changes worth simulating, from ``run``'s evidence (not yet run).

    ``host`` is the state the changes start from (``host_after`` of the fix ``run`` re-ran, so
    a later step is sized on what the earlier steps left); by default ``machine`` as dumped."""
    if request.kind == "sglang":
        failure = sgenv.sglang_env_failure(request.env)
        if failure is not None:
            return [_env_fix(failure.variable, failure.value)]
    if host is None:
        host = host_view(machine)
    out: list[Fix] = []
    o = run.observed
    backing, hp, node, _prefault = request.settings()
    if request.kind == "sglang" and o.budget is not None:
        out += _host_check_fixes(machine, host, request, o.budget)
    for r in o.reasons:
        out += _from_reason(machine, host, request, r)
    if node >= 0 and (run.unbound or any(r.errno or r.signal for r in o.reasons)):
        out += _node_fixes(machine, host, request)
    if (
        request.wants_hugepages()
        and run.outcome in ("demoted", "crashed")
        or (request.wants_hugepages() and any(r.rule == "hugepage_size_unknown" for r in o.reasons))
    ):
        for s in machine.hugepage_sizes:
            if s != hp:
                out.append(
                    Fix(
                        f"use {kb(s)} pages",
                        [request.hugepage_size_change(s)],
                        "size",
                        request_change=_set_hp(s),
                    )
                )
        out.append(
            Fix(
                "do not ask for hugepages: plain 4 KiB pages",
                [request.no_hugepages_change()],
                "no-hugepages",
                request_change=_no_hugepages,
            )
        )
    if (
        request.kind == "raw"
        and backing in SHM_BACKINGS
        and any(r.rule.startswith("memfd") for r in o.reasons)
    ):
        out.append(
            Fix(
                "use a private anonymous buffer (no memfd)",
                ["--backing anonymous"],
                "backing",
                request_change=lambda r: r.with_alloc(backing="Anonymous"),
            )
        )
    return _unique(out)


def _unique(fixes: list[Fix]) -> list[Fix]:
    seen: set[str] = set()
    out = []
    for f in fixes:
        if f.key not in seen:
            seen.add(f.key)
            out.append(f)
    return out


def _env_fix(variable: str, value: str) -> Fix:
    if variable == sgenv.HUGEPAGE_SIZE:
        try:
            good = str(parse_size(value, variable))
        except SizeError:
            good = str(sgenv.DEFAULT_HUGEPAGE_SIZE)
    else:
        good = str(sgenv.DEFAULT_NUMA_NODE)
    return Fix(
        f"fix the malformed {variable}={value!r}: sglang reads it with int()",
        [f"export {variable}={good}"],
        "env",
        request_change=_set_env(variable, good),
    )


def _host_check_fixes(
    machine: Machine, host: SimHost, request: Request, budget: dict[str, int]
) -> list[Fix]:
    h = request.hicache()
    room = budget["available"] - HICACHE_HOST_MEMORY_RESERVE_BYTES
    if h.nbytes <= room:
        return []
    out = []
    largest = largest_hicache_size_that_fits(h.bytes_per_token, h.page_size, room)
    if largest is not None:
        out.append(
            Fix(
                f"the largest --hicache-size that fits sglang's available - 10 GiB "
                f"({room / 1e9:.2f} GB) is {largest}",
                [f"--hicache-size {largest}"],
                "hicache",
                request_change=_set_hicache(largest),
            )
        )
    size = machine.default_hugepage_size
    if size:
        p = host.hugepages(size)
        deficit = h.nbytes - room
        release = -(-deficit // size)
        keep = pages_needed(request, size) if request.wants_hugepages() else 0
        releasable = p.free - p.reserved - keep
        if p.total and 0 < release <= releasable:
            n = p.total - release
            out.append(
                Fix(
                    f"shrink the {kb(size)} hugetlb pool by {release} pages to {n}: "
                    f"MemAvailable rises by {release * size / 1e9:.2f} GB and the "
                    f"{keep} pages the request needs stay in the pool",
                    [_pool_command(machine, size, n)],
                    "pool",
                    host_changes=[_pool_write(size, n)],
                )
            )
        elif p.total and p.free > p.reserved:
            n = p.total - (p.free - p.reserved)
            out.append(
                Fix(
                    f"release the {p.free - p.reserved} unreserved free pages of the "
                    f"{kb(size)} pool (to {n}): MemAvailable rises by "
                    f"{(p.free - p.reserved) * size / 1e9:.2f} GB",
                    [_pool_command(machine, size, n)],
                    "pool",
                    host_changes=[_pool_write(size, n)],
                )
            )
    return out


def _from_reason(machine: Machine, host: SimHost, request: Request, r: Reason) -> list[Fix]:
    n = r.numbers
    out: list[Fix] = []
    if r.rule == "hugetlb_reserve":
        size, short = n["hugepage_size"], n["pages_needed"] - n["available"]
        total = host.hugepages(size).total
        out.append(
            Fix(
                f"grow the {kb(size)} pool by the {short} pages it is short ({n['pages_needed']} "
                f"needed, {n['available']} available; new pages are interleaved over the nodes)",
                [_pool_command(machine, size, total + short)],
                "pool",
                host_changes=[_pool_write(size, total + short)],
            )
        )
        allow = n["surplus"] + short
        out.append(
            Fix(
                f"let the kernel allocate the {short} missing {kb(size)} pages as surplus pages "
                f"at mmap time (nr_overcommit_hugepages {n['surplus_allowed']} -> {allow})",
                [_overcommit_command(machine, size, allow)],
                "pool",
                host_changes=[_overcommit_write(size, allow)],
            )
        )
        node = request.settings()[2]
        if (
            node >= 0
            and node in machine.online()
            and any(x.id == node and x.mem_total > 0 for x in machine.nodes)
        ):
            np_ = host.node_hugepages(node, size)
            count = np_.total + max(short, n["pages_needed"] - np_.free)
            out.append(_grow_node(machine, host, node, size, count, n["pages_needed"]))
        if n["available"] > 0:
            out += _smaller(
                machine,
                request,
                n["available"] * size,
                f"the {n['available']} available {kb(size)} pages",
                unit=size,
            )
    elif r.rule == "hugetlb_fault_no_page" and n["node"] >= 0:
        size, node = n["hugepage_size"], n["node"]
        short = n["pages_needed"] - n["node_free"]
        if short > 0:
            count = host.node_hugepages(node, size).total + short
            out.append(_grow_node(machine, host, node, size, count, n["pages_needed"]))
    elif r.rule == "oom":
        fits = (n["node_free"] + n["reclaimable"]) * 9 // 10
        out += _smaller(
            machine,
            request,
            fits,
            f"90% of the {gib(fits * 10 // 9)} free and reclaimable where it faults",
        )
    elif r.rule == "memcg_oom":
        out.append(
            Fix(
                "lift the memory cgroup limit of the server's cgroup",
                ["echo max > /sys/fs/cgroup/<server cgroup>/memory.max"],
                "limits",
                machine_change=lambda m: m.apply(memcg_max=None),
            )
        )
        fits = n["limit"] * 9 // 10
        out += _smaller(machine, request, fits, f"90% of memory.max ({gib(n['limit'])})")
    elif r.rule == "hugetlb_cgroup_limit":
        from umbp_sim.dump import cgroup_hugetlb_name

        size = n["hugepage_size"]
        name = cgroup_hugetlb_name(size)

        def lift(m: Machine, size: int = size) -> Machine:
            m.hugetlb_cgroup_max.pop(size, None)
            return m.validate()

        out.append(
            Fix(
                f"lift the hugetlb cgroup limit for {kb(size)} pages",
                [f"echo max > /sys/fs/cgroup/<server cgroup>/hugetlb.{name}.max"],
                "limits",
                machine_change=lift,
            )
        )
    elif r.rule == "rlimit_as":
        out.append(
            Fix(
                "lift RLIMIT_AS for the server",
                ["ulimit -v unlimited"],
                "limits",
                machine_change=lambda m: m.apply(rlimit_as=None),
            )
        )
    elif r.rule == "commit_limit":
        out += _commit_fixes(machine, n)
    elif r.rule == "overcommit_heuristic":
        out.append(
            Fix(
                "always overcommit",
                ["sysctl -w vm.overcommit_memory=1"],
                "limits",
                machine_change=lambda m: m.apply(overcommit_memory=1),
            )
        )
    elif r.rule == "hugetlb_surplus_no_memory":
        pass  # memory, not the pool, is short: smaller sizes and plain pages are the candidates
    return out


def _grow_node(
    machine: Machine, host: SimHost, node: int, size: int, count: int, needed: int
) -> Fix:
    """Set node ``node``'s pool of ``size`` pages to ``count`` (``needed`` of them there)."""

    def describe(h: SimHost) -> str:
        free = h.node_hugepages(node, size).free
        return (
            f"grow node {node}'s {kb(size)} pool to {count} pages ({needed} needed there, "
            f"{free} free)"
        )

    return Fix(
        describe(host),
        [_pool_command(machine, size, count, node)],
        "pool",
        host_changes=[_pool_write(size, count, node)],
        describe=describe,
    )


def _commit_fixes(machine: Machine, n: dict[str, int]) -> list[Fix]:
    out = [
        Fix(
            "use heuristic overcommit",
            ["sysctl -w vm.overcommit_memory=0"],
            "limits",
            machine_change=lambda m: m.apply(overcommit_memory=0),
        )
    ]
    extra = n["committed_as"] + n["length"] - n["limit"]
    if extra > 0 and n["commit_limit"] > 0 and not machine.overcommit_kbytes:
        ratio = math.ceil(
            machine.overcommit_ratio * (n["commit_limit"] + extra) * 1.01 / n["commit_limit"]
        )
        out.append(
            Fix(
                f"raise CommitLimit by about {gib(extra)}: overcommit_ratio "
                f"{machine.overcommit_ratio} -> {ratio}",
                [f"sysctl -w vm.overcommit_ratio={ratio}"],
                "limits",
                machine_change=lambda m: m.apply(overcommit_ratio=ratio),
            )
        )
    return out


def _smaller(
    machine: Machine, request: Request, fits: int, why: str, unit: int | None = None
) -> list[Fix]:
    """Ask for what fits: a raw buffer of ``fits`` bytes, or the hicache size whose pool does."""
    page = unit or machine.page_size
    if request.kind == "raw":
        # in the unit the size was written in: the allocator rounds it up to whole pages,
        # which still fit
        text, size = size_at_most(fits // page * page, request.raw.size)
        if 0 < size < request.raw.size:
            return [
                Fix(
                    f"ask for a buffer that fits: {why} = {text}",
                    [f"--size {text}"],
                    "buffer",
                    request_change=_set_size(size),
                )
            ]
        return []
    h = request.hicache()
    largest = largest_hicache_size_that_fits(h.bytes_per_token, h.page_size, fits)
    if largest is None or largest >= (request.sglang.get("hicache_size") or math.inf):
        return []
    return [
        Fix(
            f"a --hicache-size whose pool fits: {why}, so at most {largest}",
            [f"--hicache-size {largest}"],
            "hicache",
            request_change=_set_hicache(largest),
        )
    ]


def _node_fixes(machine: Machine, host: SimHost, request: Request) -> list[Fix]:
    """Bind elsewhere (the three nodes with the most free memory of the kind asked) or unbind."""
    _backing, hp, node, _prefault = request.settings()
    wants = request.wants_hugepages() and hp in machine.hugepage_sizes
    online = set(machine.online())
    mem_nodes = [n.id for n in machine.nodes if n.id in online and n.mem_total > 0]
    free_mem = dict(zip([n.id for n in machine.nodes], _node_free_now(host), strict=True))

    def score(n: int) -> int:
        return host.node_hugepages(n, hp).free * hp if wants else free_mem.get(n, 0)

    others = sorted((n for n in mem_nodes if n != node), key=lambda n: (-score(n), n))[:3]
    out = []
    for n in others:
        what = (
            f"{host.node_hugepages(n, hp).free} free {kb(hp)} pages there"
            if wants
            else f"{gib(free_mem.get(n, 0))} free and reclaimable there"
        )
        out.append(
            Fix(
                f"bind to node {n} instead ({what})",
                [request.node_change(n)],
                "node",
                request_change=_set_node(n),
            )
        )
    out.append(
        Fix(
            "do not bind to a node (-1): pages come from any node",
            [request.node_change(-1)],
            "node",
            request_change=_set_node(-1),
        )
    )
    return out


def _node_free_now(host: SimHost) -> list[int]:
    """Free + reclaimable bytes per node, from the simulated host's node meminfo files."""
    out = []
    for n in host.machine.nodes:
        free = 0
        try:
            text = host.read(f"/sys/devices/system/node/node{n.id}/meminfo")
        except OSError:
            text = ""
        for line in text.splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[2] == "MemFree:":
                free = int(parts[3]) * 1024
        out.append(free + host.reclaimable(n.id))
    return out


# ---- the search -------------------------------------------------------------------------------


@dataclass
class Search:
    """The result of ``propose``: recommended sets, partial successes, and what did not help."""

    fixes: list[Fix]
    not_helping: list[Fix]
    limit: str | None = None
    runs: int = 0


def run_fix(machine: Machine, request: Request, fix: Fix, profile: str | None = None) -> Run:
    changes = tuple(fix.host_changes)
    fix.run = simulate_request(fix.machine(machine), fix.request(request), changes, profile)
    return fix.run


def host_after(machine: Machine, fix: Fix) -> SimHost:
    """The simulated host as ``fix`` leaves it (its Machine change, then its admin writes):
    where the next step of a combination starts, so that step is sized on what is left."""
    if not fix.host_changes and fix.machine_change is None:
        return host_view(machine)
    host = SimHost(fix.machine(machine).copy())
    for change in fix.host_changes:
        change(host)
    return host


def _overwrites(fix: Fix) -> bool:
    """Two steps write the same pool file: the later one's value is all that is left."""
    targets = [c.target for c in fix.host_changes if isinstance(c, PoolWrite)]
    return len(targets) != len(set(targets))


def _next_steps(machine: Machine, request: Request, f: Fix) -> list[Fix]:
    """Candidates after ``f``: from its run's evidence, sized on the host it leaves."""
    assert f.run is not None
    after = f.machine(machine)
    steps = frozenset(s.key for s in f.singles)
    found = candidates(after, f.request(request), f.run, host_after(machine, f))
    return [replace(g, sized_after=steps) for g in found]


def _value(f: Fix) -> tuple[int, int, int]:
    """Higher is better: outcome rank, fewer compromises, fewer changes."""
    assert f.run is not None
    return (f.run.rank, -f.compromises, -len(f.singles))


def propose(
    machine: Machine, request: Request, baseline: Run, profile: str | None = None
) -> Search:
    """Search single changes and combinations; every returned fix was simulated."""
    tried: dict[frozenset[str], Fix] = {}
    runs = 0

    def trial(fix: Fix) -> Fix | None:
        nonlocal runs
        key = frozenset(s.key for s in fix.singles)
        if key in tried:
            return tried[key]
        kinds = [s.category for s in fix.singles if s.category in COMPROMISES]
        if len(kinds) != len(set(kinds)):
            return None  # two bindings, two sizes ... at once
        if _overwrites(fix):
            return None
        if runs >= MAX_RUNS:
            return None
        runs += 1
        run_fix(machine, request, fix, profile)
        tried[key] = fix
        return fix

    singles = candidates(machine, request, baseline)
    for f in singles:
        trial(f)
    done = lambda: any(f.run and f.run.got_what_was_asked for f in tried.values())  # noqa: E731

    # Pairs of different kinds.
    for a, b in itertools.combinations(singles, 2):
        if a.category != b.category or a.category == "pool":
            trial(combine([a, b]))
    # Extend the singles that changed the outcome: their run shows the next obstacle.
    frontier = sorted(
        (f for f in singles if f.run and f.run.rank < 3 and _changed(f.run, baseline)),
        key=lambda f: -f.run.rank if f.run else 0,
    )[:3]
    for f in frontier:
        for g in _next_steps(machine, request, f):
            if g.key not in {s.key for s in f.singles}:
                trial(combine([f, g]))
    if not done():
        best = sorted(
            (
                f
                for f in tried.values()
                if len(f.singles) == 2 and f.run and f.run.rank < 3 and f.run.rank > baseline.rank
            ),
            key=lambda f: _value(f),
            reverse=True,
        )[:2]
        for f in best:
            for g in _next_steps(machine, request, f):
                if g.key not in {s.key for s in f.singles}:
                    trial(combine([f, g]))

    # A combination that gets everything may carry a step a later one made moot (a pool
    # released for sglang's check, when a smaller --hicache-size passes it anyway): drop each
    # step whose removal, re-simulated, does as well.
    for f in [f for f in tried.values() if f.run and f.run.rank == 3 and len(f.singles) > 1]:
        _without_moot_steps(f, trial)
    helping = [f for f in tried.values() if f.run and f.run.rank > baseline.rank]
    # Minimal: no proper subset does as well.
    by_key = {frozenset(s.key for s in f.singles): f for f in helping}
    minimal = []
    for key, f in by_key.items():
        assert f.run is not None
        sub_better = any(
            k < key and g.run is not None and g.run.rank >= f.run.rank for k, g in by_key.items()
        )
        if not sub_better:
            minimal.append(f)
    minimal.sort(key=_value, reverse=True)
    # The smallest sets that get everything, then the best partial successes.
    full = [f for f in minimal if f.run and f.run.rank == 3]
    if full:
        least = min(len(f.singles) for f in full)
        full = [f for f in full if len(f.singles) == least]
    partial = [f for f in minimal if f.run and f.run.rank < 3]
    # Partial successes (ok but unbound, demoted) only when nothing gets everything.
    minimal = full[:3] if full else partial[:3]
    mild_ok = any(
        f.run and f.run.rank == 3 and not any(s.category in HEAVY for s in f.singles)
        for f in minimal
    )
    if mild_ok:
        minimal = [f for f in minimal if not any(s.category in HEAVY for s in f.singles)]
    not_helping = [f for f in singles if f.run is not None and f.run.rank <= baseline.rank]
    limit = None
    if not minimal:
        limit = _limit(baseline, [f for f in singles if f.run is not None])
    return Search([_described(machine, f) for f in minimal], not_helping, limit, runs)


def _without_moot_steps(fix: Fix, trial: Callable[[Fix], Fix | None]) -> Fix:
    """``fix`` less every step it does without: each removal is simulated (``trial``)."""
    while len(fix.singles) > 1 and fix.run is not None:
        for i in range(len(fix.singles)):
            rest = trial(combine(fix.singles[:i] + fix.singles[i + 1 :]))
            if rest is not None and rest.run is not None and rest.run.rank >= fix.run.rank:
                fix = rest
                break
        else:
            break
    return fix


def _described(machine: Machine, fix: Fix) -> Fix:
    """``fix`` with each step described on the host the steps before it leave (a step read
    from a run of steps no longer before it is said by its commands)."""
    if not fix.parts:
        return fix
    parts: list[Fix] = []
    for p in fix.parts:
        if p.describe is not None:
            before = host_after(machine, combine(parts)) if parts else host_view(machine)
            p = replace(p, action=p.describe(before))
        elif not p.sized_after <= {q.key for q in parts}:
            p = replace(p, action="; ".join(p.commands))
        parts.append(p)
    out = combine(parts)
    out.run = fix.run
    return out


def _changed(run: Run, baseline: Run) -> bool:
    return (run.outcome, run.observed.error) != (baseline.outcome, baseline.observed.error)


def _limit(baseline: Run, tried: list[Fix]) -> str:
    """The rule that stands in the way: the last failure SimKernel (or sglang) recorded."""
    from umbp_sim.diagnose.explain import _kernel

    runs = [baseline] + [f.run for f in tried if f.run is not None]
    for run in runs:
        failing = [r for r in run.observed.reasons if r.errno or r.signal]
        if failing:
            causes = _kernel(failing[-1:], run)
            if causes:
                return causes[0].text
    o = baseline.observed
    if o.budget is not None:
        avail = o.budget["available"]
        return (
            f"sglang's host check: it keeps 10 GiB of the {gib(avail)} available for the rest of "
            "the server, and no --hicache-size from 1 GB up fits in what is left"
        )
    return "none that SimKernel recorded: " + (o.error or "; ".join(o.warnings) or o.outcome)


__all__ = [
    "Fix",
    "PoolWrite",
    "Search",
    "candidates",
    "combine",
    "host_after",
    "propose",
    "run_fix",
]
