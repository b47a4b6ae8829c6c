"""The fixes a run's evidence suggests, each a :class:`Fix` not yet run.

Candidates come from the evidence of a run (SimKernel's reasons, what sglang's check read, the
allocator's warnings), never from re-deriving the kernel's rules here: a pool grown by the
pages it is short, a limit lifted, another node, a smaller buffer or ``--hicache-size``, a
fixed environment variable. ``diagnose/fix_search.py`` runs them and their combinations.
"""

from __future__ import annotations

import math

from umbp_sim.diagnose.explain import gib, kb, pages_needed
from umbp_sim.diagnose.fix import Fix, RequestChange
from umbp_sim.diagnose.pool_writes import (
    overcommit_command,
    overcommit_write,
    pool_command,
    pool_write,
)
from umbp_sim.diagnose.replay_request import Request
from umbp_sim.diagnose.simulate import Simulation
from umbp_sim.host.arch_sizes import MiB
from umbp_sim.machine import Machine
from umbp_sim.sglang import env as sgenv
from umbp_sim.sglang.sizing import HICACHE_HOST_MEMORY_RESERVE_BYTES, largest_hicache_size_that_fits
from umbp_sim.sim import HostState, Reason, host_view, overcommit_ratio_for
from umbp_sim.vocabulary.backing import SHM_BACKINGS
from umbp_sim.vocabulary.units import (
    SizeError,
    cgroup_hugetlb_name,
    parse_size,
    pod_hugepages_limit,
    size_at_most,
    spaced_size,
)


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


def _sizes_for(machine: Machine, hp: int, biggest: int) -> list[int]:
    """The other hugepage sizes a person would use for a ``biggest``-byte buffer: from 1 MiB
    (64 kB pages for a 93 GiB buffer are no hugepages) and not above the buffer (a 16 GiB page
    for an 8 GiB buffer); where no such size exists, the smallest one up to twice the buffer
    (POWER's 16 MiB page for a 10 MiB buffer)."""
    others = [s for s in machine.hugepage_sizes if s != hp and s >= MiB]
    fitting = [s for s in others if s <= max(biggest, MiB)]
    if fitting:
        return fitting
    above = [s for s in others if s <= 2 * biggest]
    return [min(above)] if above else []


def candidates(
    machine: Machine,
    request: Request,
    run: Simulation,
    host: HostState | None = None,
    pod: bool = False,
) -> list[Fix]:
    """Single changes worth simulating, from ``run``'s evidence (not yet run).

    ``host`` is the state the changes start from: by default the state ``run``'s own changes
    left (``run.state``: for the baseline the dumped host; for a fix's run the host it makes, so
    a later step is sized on what the earlier steps left). ``pod``: the server's hugetlb limit
    is a Kubernetes pod's, changed in its spec."""
    if request.kind == "sglang":
        failure = sgenv.sglang_env_failure(request.env)
        if failure is not None:
            return [_env_fix(failure.variable, failure.value)]
    if host is None:
        host = run.state or host_view(machine).state()
    out: list[Fix] = []
    o = run.observed
    backing, hp, node, _prefault = request.settings()
    if request.kind == "sglang" and o.budget is not None:
        out += _host_check_fixes(machine, host, request, o.budget)
    if request.kind == "raw":
        out += _check_room_fixes(machine, host, request, run)
    share = _ranks_from_first_short(request, run)
    seen: set[tuple[str, tuple[tuple[str, int], ...]]] = set()
    for r in o.reasons:
        key = (r.rule, tuple(sorted(r.numbers.items())))
        if key not in seen:  # several ranks meeting the same shortage: once
            seen.add(key)
            out += _from_reason(machine, host, request, r, share, pod)
    if node >= 0 and (run.unbound or any(r.errno or r.signal for r in o.reasons)):
        out += _node_fixes(machine, host, request)
    if (
        request.wants_hugepages()
        and run.outcome in ("demoted", "crashed")
        or (request.wants_hugepages() and any(r.rule == "hugepage_size_unknown" for r in o.reasons))
    ):
        for s in _sizes_for(machine, hp, max(request.buffer_sizes())):
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
                f"do not ask for hugepages: plain {spaced_size(machine.page_size)} pages",
                [request.no_hugepages_change()],
                "no-hugepages",
                request_change=_no_hugepages,
            )
        )
    if (
        request.kind == "raw"
        and not request.sglang_raised
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
    machine: Machine, host: HostState, request: Request, budget: dict[str, int]
) -> list[Fix]:
    h = request.hicache()
    room = budget["available"] - HICACHE_HOST_MEMORY_RESERVE_BYTES
    if h.nbytes <= room:
        return []
    out = []
    # Several ranks: each rank's check sees the pools of the ranks before it, so the last of n
    # passes only if n pools fit in what the host had available before the first.
    n = request.ranks
    first = host.numbers.mem_available - HICACHE_HOST_MEMORY_RESERVE_BYTES
    fits = room if n == 1 else first // n
    said = (
        f"{room / 1e9:.2f} GB"
        if n == 1
        else f"{first / 1e9:.2f} GB before the first rank, shared by {n} ranks"
    )
    largest = largest_hicache_size_that_fits(h.bytes_per_token, h.page_size, fits)
    if largest is not None:
        out.append(
            Fix(
                f"the largest --hicache-size that fits sglang's available - 10 GiB "
                f"({said}) is {largest}",
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
                    [pool_command(machine, size, n)],
                    "pool",
                    host_changes=[pool_write(size, n)],
                )
            )
        elif p.total and p.free > p.reserved:
            n = p.total - (p.free - p.reserved)
            out.append(
                Fix(
                    f"release the {p.free - p.reserved} unreserved free pages of the "
                    f"{kb(size)} pool (to {n}): MemAvailable rises by "
                    f"{(p.free - p.reserved) * size / 1e9:.2f} GB",
                    [pool_command(machine, size, n)],
                    "pool",
                    host_changes=[pool_write(size, n)],
                )
            )
    return out


def _check_room_fixes(
    machine: Machine, host: HostState, request: Request, run: Simulation
) -> list[Fix]:
    """The buffer sizes that leave the host what sglang's host check keeps for the rest of the
    server (MemAvailable - 10 GiB, on the host the change starts from): for an sglang error
    line the sizes its check passes, for a raw request the sizes that are safe beside the
    rest of the server. A hugetlb pool grown for the buffer leaves MemAvailable, so a buffer
    of S bytes beyond the pool's free pages needs S + (S - free) <= available - 10 GiB."""
    o = run.observed
    n = request.ranks  # each rank's check sees the ranks before it on the host
    use_budget = o.budget is not None and n == 1
    avail = o.budget["available"] if use_budget else host.numbers.mem_available  # type: ignore[index]
    room = avail - HICACHE_HOST_MEMORY_RESERVE_BYTES
    what = "sglang's available - 10 GiB" if request.sglang_raised else "MemAvailable - 10 GiB"
    if n > 1:
        what += f" shared by {n} ranks"
    _backing, hp, _node, _prefault = request.settings()
    out: list[Fix] = []
    if request.wants_hugepages() and hp in machine.hugepage_sizes:
        p = host.hugepages(hp)
        free = max(0, p.free - p.reserved) * hp
        # n buffers of S: the pool grows by n*S - free before the ranks start, and each rank's
        # check needs S <= available - (n*S - free) - 10 GiB.
        fits = min(room, max(free // n, (room + free) // (n + 1)))
        out += _smaller(
            machine,
            request,
            fits,
            f"{what} ({room / 1e9:.2f} GB) with the hugepages its pool gains taken from it",
        )
    # plain pages: the last rank's check sees the n - 1 buffers before it
    out += _smaller(machine, request, room // n, f"{what} ({room / 1e9:.2f} GB)")
    return out


def _ranks_from_first_short(request: Request, run: Simulation) -> int:
    """The ranks a shortage is met by: from the first rank that did not get everything to the
    last (1 for one rank). The first such rank's reasons come first, and every rank after it
    needs as much again."""
    ranks = run.observed.ranks
    if request.ranks <= 1 or not ranks:
        return 1
    first = next((e["rank"] for e in ranks if e["outcome"] != "ok"), len(ranks))
    return max(1, request.ranks - first)


def _from_reason(
    machine: Machine, host: HostState, request: Request, r: Reason, share: int = 1,
    pod: bool = False,
) -> list[Fix]:  # fmt: skip
    """The fixes one reason suggests; ``share``: the ranks still to be served from what the
    reason says is short (each needing the pages or memory its rank needed)."""
    n = r.numbers
    out: list[Fix] = []
    if r.rule == "hugetlb_reserve":
        size = n["hugepage_size"]
        short = n["pages_needed"] - n["available"] + (share - 1) * n["pages_needed"]
        total = host.hugepages(size).total
        needed = f"{n['pages_needed']} needed" + (f" by each of {share} ranks" if share > 1 else "")
        out.append(
            Fix(
                f"grow the {kb(size)} pool by the {short} pages it is short ({needed}, "
                f"{n['available']} available; new pages are interleaved over the nodes)",
                [pool_command(machine, size, total + short)],
                "pool",
                host_changes=[pool_write(size, total + short)],
                sized_for_buffer=True,
            )
        )
        allow = n["surplus"] + short
        out.append(
            Fix(
                f"let the kernel allocate the {short} missing {kb(size)} pages as surplus pages "
                f"at mmap time (nr_overcommit_hugepages {n['surplus_allowed']} -> {allow})",
                [overcommit_command(machine, size, allow)],
                "pool",
                host_changes=[overcommit_write(size, allow)],
                sized_for_buffer=True,
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
                n["available"] * size // share,
                f"the {n['available']} available {kb(size)} pages",
                unit=size,
            )
    elif r.rule == "hugetlb_fault_no_page" and n["node"] >= 0:
        size, node = n["hugepage_size"], n["node"]
        short = n["pages_needed"] - n["node_free"] + (share - 1) * n["pages_needed"]
        if short > 0:
            count = host.node_hugepages(node, size).total + short
            out.append(_grow_node(machine, host, node, size, count, n["pages_needed"]))
    elif r.rule == "oom":
        fits = (n["node_free"] + n["reclaimable"]) * 9 // 10 // share
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
                service=["echo max > /sys/fs/cgroup/<server cgroup>/memory.max"],
            )
        )
        fits = n["limit"] * 9 // 10 // share
        out += _smaller(machine, request, fits, f"90% of memory.max ({gib(n['limit'])})")
    elif r.rule == "hugetlb_cgroup_limit":
        size = n["hugepage_size"]
        name = cgroup_hugetlb_name(size)

        def lift(m: Machine, size: int = size) -> Machine:
            m.hugetlb_cgroup_max.pop(size, None)
            return m.validate()

        if pod:  # Kubernetes sets the limit from the pod spec: the fix is there
            limit = -(-pages_needed(request, size) * request.ranks * size // MiB) * MiB
            spec = pod_hugepages_limit(size, limit)

            def give(m: Machine, size: int = size, limit: int = limit) -> Machine:
                m.hugetlb_cgroup_max[size] = limit
                return m.validate()

            out.append(
                Fix(
                    f"give the pod a hugepages limit its buffers fit ({kb(size)} pages)",
                    [f"{spec} (the pod spec, requests the same)"],
                    "limits",
                    machine_change=give,
                    service=[f"the pod spec's {spec}"],
                )
            )
            return out
        out.append(
            Fix(
                f"lift the hugetlb cgroup limit for {kb(size)} pages",
                [f"echo max > /sys/fs/cgroup/<server cgroup>/hugetlb.{name}.max"],
                "limits",
                machine_change=lift,
                service=[f"echo max > /sys/fs/cgroup/<server cgroup>/hugetlb.{name}.max"],
            )
        )
    elif r.rule == "rlimit_as":
        out.append(
            Fix(
                "lift RLIMIT_AS for the server",
                ["ulimit -v unlimited"],
                "limits",
                machine_change=lambda m: m.apply(rlimit_as=None),
                service=["ulimit -v unlimited (a unit's LimitAS=infinity, docker --ulimit as=-1)"],
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
                sysctls={"vm.overcommit_memory": "1"},
            )
        )
    elif r.rule == "hugetlb_surplus_no_memory":
        pass  # memory, not the pool, is short: smaller sizes and plain pages are the candidates
    return out


def _grow_node(
    machine: Machine, host: HostState, node: int, size: int, count: int, needed: int
) -> Fix:
    """Set node ``node``'s pool of ``size`` pages to ``count`` (``needed`` of them there)."""

    def describe(h: HostState) -> str:
        free = h.node_hugepages(node, size).free
        return (
            f"grow node {node}'s {kb(size)} pool to {count} pages ({needed} needed there, "
            f"{free} free)"
        )

    return Fix(
        describe(host),
        [pool_command(machine, size, count, node)],
        "pool",
        host_changes=[pool_write(size, count, node)],
        describe=describe,
        sized_for_buffer=True,
    )


def _commit_fixes(machine: Machine, n: dict[str, int]) -> list[Fix]:
    out = [
        Fix(
            "use heuristic overcommit",
            ["sysctl -w vm.overcommit_memory=0"],
            "limits",
            machine_change=lambda m: m.apply(overcommit_memory=0),
            sysctls={"vm.overcommit_memory": "0"},
        )
    ]
    extra = n["committed_as"] + n["length"] - n["limit"]
    # the ratio whose CommitLimit (SimKernel's) has 1% to spare
    target = math.ceil((n["commit_limit"] + extra) * 1.01)
    ratio = overcommit_ratio_for(machine, target) if extra > 0 else None
    if ratio is not None and n["commit_limit"] > 0 and not machine.overcommit_kbytes:
        out.append(
            Fix(
                f"raise CommitLimit by about {gib(extra)}: overcommit_ratio "
                f"{machine.overcommit_ratio} -> {ratio}",
                [f"sysctl -w vm.overcommit_ratio={ratio}"],
                "limits",
                machine_change=lambda m: m.apply(overcommit_ratio=ratio),
                sysctls={"vm.overcommit_ratio": str(ratio)},
            )
        )
    return out


def _smaller(
    machine: Machine, request: Request, fits: int, why: str, unit: int | None = None
) -> list[Fix]:
    """Ask for what fits: a raw buffer of ``fits`` bytes, or the hicache size whose pool does."""
    page = unit or machine.page_size
    if request.sglang_raised:
        return _smaller_hicache_of_line(request, fits, why)
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


# sglang's pool is int(hicache_size * 1e9 // B) tokens rounded down to a page, plus one more page
# of tokens: at most this many bytes past hicache_size x 10^9 for the models it serves (64 tokens
# of 1 MiB each). An error line gives the pool's bytes, not the model, so a size is offered with
# this much room and simulated at its largest.
HICACHE_PAGE_SLACK = 64 << 20


def _smaller_hicache_of_line(request: Request, fits: int, why: str) -> list[Fix]:
    """The ``--hicache-size`` (GB per rank) whose pool fits in ``fits`` bytes, for the alloc an
    sglang error line names; simulated at the largest pool that size gives."""
    gb = (fits - HICACHE_PAGE_SLACK) // 10**9
    size = gb * 10**9 + HICACHE_PAGE_SLACK
    if gb < 1 or size >= request.raw.size:
        return []
    return [
        Fix(
            f"a --hicache-size whose pool fits: {why}, so at most {gb} (per rank: about "
            f"{gb} x 10^9 bytes of host pool)",
            [f"--hicache-size {gb}"],
            "hicache",
            request_change=_set_size(size),
        )
    ]


def _node_fixes(machine: Machine, host: HostState, request: Request) -> list[Fix]:
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


def _node_free_now(host: HostState) -> list[int]:
    """Free + reclaimable bytes per node, as SimKernel has them."""
    return [host.numbers.node(n.id).mem_free + host.reclaimable(n.id) for n in host.machine.nodes]


__all__ = ["candidates"]
