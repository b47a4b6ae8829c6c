"""Candidate fixes for one machine and request, each re-run in simulation before it is shown.

A :class:`Fix` is a change to the host (an admin write applied to the fresh simulated host, or
a changed Machine copy for limits) and/or to the request (env, flags, ``--hicache-size``),
with the exact commands a person would type. ``propose`` computes the numbers from the dump,
re-runs every candidate, and splits them into the ones whose simulated outcome is better than
the replay's (recommended) and the ones that do not help. When no single fix gets the request
everything it asks, the helpful ones are combined and re-run once more.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from umbp_sim.diagnose.explain import HostView, gib, kb, nodelist, pages_needed
from umbp_sim.diagnose.request import Request
from umbp_sim.diagnose.run import Run, simulate_request
from umbp_sim.machine import Machine
from umbp_sim.sglang import env as sgenv
from umbp_sim.sglang.sizing import largest_hicache_size_that_fits
from umbp_sim.sim import SimHost
from umbp_sim.units import SizeError, parse_size

HostChange = Callable[[SimHost], "str | None"]


@dataclass
class Fix:
    action: str
    commands: list[str]
    category: str  # pool|node|size|buffer|hicache|env|limits|no-hugepages|combined
    request: Request | None = None  # the changed request (None: unchanged)
    host_changes: list[HostChange] = field(default_factory=list)
    machine: Machine | None = None  # a changed copy (None: unchanged)
    run: Run | None = None

    @property
    def outcome_after(self) -> str:
        return self.run.summary() if self.run else "not run"

    def to_json(self) -> dict[str, object]:
        return {
            "action": self.action,
            "commands": list(self.commands),
            "outcome_after": self.outcome_after,
            "outcome": self.run.outcome if self.run else None,
        }


def _pool_write(size: int, count: int, node: int | None = None) -> HostChange:
    def apply(host: SimHost) -> str | None:
        before = host.node_hugepages(node, size) if node is not None else host.hugepages(size)
        host.set_nr_hugepages(size, count, node)
        after = host.node_hugepages(node, size) if node is not None else host.hugepages(size)
        if after.total < count and after.total >= before.total:
            where = f"node {node}" if node is not None else "the host"
            return f"the kernel made only {after.total} of {count} pages on {where}"
        return None

    return apply


def _pool_command(view: HostView, size: int, count: int, node: int | None = None) -> str:
    if node is not None:
        return (
            f"echo {count} > /sys/devices/system/node/node{node}/hugepages/"
            f"hugepages-{size // 1024}kB/nr_hugepages"
        )
    if size == view.machine.default_hugepage_size:
        return f"sysctl -w vm.nr_hugepages={count}"
    return f"echo {count} > /sys/kernel/mm/hugepages/hugepages-{size // 1024}kB/nr_hugepages"


def candidates(view: HostView, request: Request, baseline: Run) -> list[Fix]:
    """Every change worth simulating for this request on this host (not yet run)."""
    m = view.machine
    out: list[Fix] = []
    if request.kind == "sglang":
        failure = sgenv.sglang_env_failure(request.env)
        if failure is not None:
            return [_env_fix(request, failure.variable, failure.value)]
        out += _host_check_fixes(view, request)
        if out:
            return out
    backing, hp, node, _prefault = request.settings()
    bound = node if node >= 0 and node in view.memory_nodes() else None
    wrong_node = node >= 0 and bound is None
    wants = request.wants_hugepages()

    if wants and hp in m.hugepage_sizes:
        need = pages_needed(request, hp)
        p = view.pool(hp)
        avail = p.free - p.reserved
        short = max(0, need - avail)
        if short:
            n = p.total + short
            out.append(
                Fix(
                    f"grow the {kb(hp)} pool by the {short} pages it is short "
                    f"({need} needed, {avail} available; the kernel interleaves new pages "
                    f"over nodes {nodelist(view.memory_nodes())})",
                    [_pool_command(view, hp, n)],
                    "pool",
                    host_changes=[_pool_write(hp, n)],
                )
            )
        if bound is not None:
            np_ = view.node_pool(bound, hp)
            node_short = max(need - np_.free, short)
            if node_short > 0:
                n = np_.total + node_short
                out.append(
                    Fix(
                        f"grow node {bound}'s {kb(hp)} pool to {n} pages ({need} needed there, "
                        f"{np_.free} free)",
                        [_pool_command(view, hp, n, bound)],
                        "pool",
                        host_changes=[_pool_write(hp, n, bound)],
                    )
                )
    if node >= 0:
        out += _node_fixes(view, request, hp if wants else None, bound, wrong_node)
    if wants:
        out += _size_fixes(view, request, hp, bound)
    if request.kind == "raw":
        out += _smaller_buffer_fixes(view, request, hp if wants else None, bound)
    out += _limit_fixes(view, request, hp)
    del backing, baseline
    return out


def _env_fix(request: Request, variable: str, value: str) -> Fix:
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
        request=request.with_env(**{variable: good}),
    )


def _host_check_fixes(view: HostView, request: Request) -> list[Fix]:
    h = request.hicache()
    budget = view.budget()
    if h.nbytes <= budget:
        return []
    out = []
    largest = largest_hicache_size_that_fits(h.bytes_per_token, h.page_size, budget)
    if largest is not None:
        out.append(
            Fix(
                f"the largest --hicache-size that fits MemAvailable - 10 GiB "
                f"({budget / 1e9:.2f} GB) is {largest}",
                [f"--hicache-size {largest}"],
                "hicache",
                request=request.with_hicache_size(largest),
            )
        )
    default = view.machine.default_hugepage_size
    if default:
        p = view.pool(default)
        deficit = h.nbytes - budget
        release = -(-deficit // default)
        keep_for_request = pages_needed(request, default) if request.wants_hugepages() else 0
        releasable = p.free - p.reserved - keep_for_request
        if p.total and 0 < release <= releasable:
            n = p.total - release
            out.append(
                Fix(
                    f"shrink the {kb(default)} hugetlb pool by {release} pages to {n}: "
                    f"MemAvailable rises by {release * default / 1e9:.2f} GB and the "
                    f"{keep_for_request} pages the request needs stay in the pool",
                    [_pool_command(view, default, n)],
                    "pool",
                    host_changes=[_pool_write(default, n)],
                )
            )
        elif p.total and p.free > p.reserved:
            n = p.total - (p.free - p.reserved)
            out.append(
                Fix(
                    f"release the {p.free - p.reserved} unreserved free pages of the "
                    f"{kb(default)} pool "
                    f"(to {n}): MemAvailable rises by "
                    f"{(p.free - p.reserved) * default / 1e9:.2f} GB",
                    [_pool_command(view, default, n)],
                    "pool",
                    host_changes=[_pool_write(default, n)],
                )
            )
    return out


def _node_fixes(
    view: HostView, request: Request, hp: int | None, bound: int | None, wrong: bool
) -> list[Fix]:
    total = sum(request.buffer_sizes())
    choices = []
    for n in view.memory_nodes():
        if n == bound:
            continue
        if hp is not None and hp in view.machine.hugepage_sizes:
            free = view.node_pool(n, hp).free
            if free >= pages_needed(request, hp):
                choices.append((free, n, f"{free} free {kb(hp)} pages there"))
        elif view.node_mem_free(n) >= total:
            free = view.node_mem_free(n)
            choices.append((free, n, f"{free // (1 << 20)} MiB free there"))
    out = []
    if choices:
        _free, n, why = max(choices)
        out.append(
            Fix(
                f"bind to node {n} instead ({why})",
                [request.node_change(n)],
                "node",
                request=request.with_node(n),
            )
        )
    if wrong or not choices:
        out.append(
            Fix(
                "do not bind to a node (-1): pages come from any node",
                [request.node_change(-1)],
                "node",
                request=request.with_node(-1),
            )
        )
    return out


def _size_fixes(view: HostView, request: Request, hp: int, bound: int | None) -> list[Fix]:
    out = []
    for s in view.machine.hugepage_sizes:
        if s == hp:
            continue
        need = pages_needed(request, s)
        p = view.pool(s)
        free = view.node_pool(bound, s).free if bound is not None else p.free - p.reserved
        if free >= need:
            out.append(
                Fix(
                    f"use {kb(s)} pages: {need} needed, {free} free"
                    + (f" on node {bound}" if bound is not None else ""),
                    [request.hugepage_size_change(s)],
                    "size",
                    request=request.with_hugepage_size(s),
                )
            )
    return out


def _smaller_buffer_fixes(
    view: HostView, request: Request, hp: int | None, bound: int | None
) -> list[Fix]:
    """A raw request that cannot be had at its size: the largest one this host can give."""
    out = []
    if hp is not None and hp in view.machine.hugepage_sizes:
        p = view.pool(hp)
        pages = view.node_pool(bound, hp).free if bound is not None else p.free - p.reserved
        size = pages * hp
        if 0 < size < request.size:
            where = f" on node {bound}" if bound is not None else ""
            out.append(
                Fix(
                    f"ask for what the {kb(hp)} pool can give{where}: {pages} pages = {size} "
                    f"bytes ({gib(size)})",
                    [f"--size {size}"],
                    "buffer",
                    request=dataclasses.replace(request, size=size),
                )
            )
    avail = view.mem_available() or view.meminfo.get("MemFree", 0) * 1024
    page = view.machine.page_size
    size = avail * 9 // 10 // page * page  # leave the host a tenth of what it has free
    if 0 < size < request.size and (hp is None or not out):
        out.append(
            Fix(
                f"ask for a buffer that fits in free memory: 90% of {gib(avail)} = {size} bytes",
                [f"--size {size}"],
                "buffer",
                request=dataclasses.replace(request, size=size),
            )
        )
    return out


def _limit_fixes(view: HostView, request: Request, hp: int) -> list[Fix]:
    m = view.machine
    total = sum(request.buffer_sizes())
    out = []
    if m.memcg_max is not None and m.memcg_max < total:
        out.append(
            Fix(
                "lift the memory cgroup limit of the server's cgroup",
                ["echo max > /sys/fs/cgroup/<server cgroup>/memory.max"],
                "limits",
                machine=m.copy().apply(memcg_max=None),
            )
        )
    cg = m.hugetlb_cgroup_max.get(hp)
    if cg is not None and request.wants_hugepages() and cg < pages_needed(request, hp) * hp:
        from umbp_sim.dump import cgroup_hugetlb_name

        copy = m.copy()
        copy.hugetlb_cgroup_max.pop(hp)
        name = cgroup_hugetlb_name(hp)
        out.append(
            Fix(
                f"lift the hugetlb cgroup limit for {kb(hp)} pages",
                [f"echo max > /sys/fs/cgroup/<server cgroup>/hugetlb.{name}.max"],
                "limits",
                machine=copy.validate(),
            )
        )
    if m.rlimit_as is not None and m.rlimit_as < total:
        out.append(
            Fix(
                "lift RLIMIT_AS for the server",
                ["ulimit -v unlimited"],
                "limits",
                machine=m.copy().apply(rlimit_as=None),
            )
        )
    if m.overcommit_memory == 2 and not request.wants_hugepages():
        out.append(
            Fix(
                "use heuristic overcommit",
                ["sysctl -w vm.overcommit_memory=0"],
                "limits",
                machine=m.copy().apply(overcommit_memory=0),
            )
        )
    return out


def run_fix(view: HostView, request: Request, fix: Fix) -> Run:
    changes = list(fix.host_changes)

    def setup(host: SimHost) -> str | None:
        notes = [n for n in (c(host) for c in changes) if n]
        return "; ".join(notes) or None

    fix.run = simulate_request(fix.machine or view.machine, fix.request or request, setup)
    return fix.run


def _combine(request: Request, fixes: list[Fix]) -> Fix:
    """One fix doing all of ``fixes`` (one per category), in order."""
    req = request
    machine = None
    changes: list[HostChange] = []
    commands: list[str] = []
    for f in fixes:
        if f.request is not None:
            # Re-derive the change on top of the previous ones (env and flags compose).
            if f.category == "node":
                req = req.with_node(f.request.settings()[2])
            elif f.category == "size":
                req = req.with_hugepage_size(f.request.settings()[1])
            elif f.category == "buffer":
                req = dataclasses.replace(req, size=f.request.size)
            elif f.category == "hicache":
                req = req.with_hicache_size(f.request.sglang["hicache_size"])
            else:
                req = f.request
        machine = f.machine or machine
        changes += f.host_changes
        commands += f.commands
    return Fix(
        "all of: " + "; ".join(f.action for f in fixes),
        commands,
        "combined",
        request=req,
        host_changes=changes,
        machine=machine,
    )


def propose(view: HostView, request: Request, baseline: Run) -> tuple[list[Fix], list[Fix]]:
    """(recommended, not helping): every candidate re-run and ranked against the replay."""
    fixes = candidates(view, request, baseline)
    for f in fixes:
        run_fix(view, request, f)
    if any(f.run and f.run.rank == 3 and f.category != "buffer" for f in fixes):
        # Asking for less is the last resort: drop it when a fix gets the whole request.
        fixes = [f for f in fixes if f.category != "buffer"]
    if request.wants_hugepages() and baseline.rank < 3:
        keeps_hugepages_ok = any(
            f.run and f.run.rank == 3 and f.run.observed.actual_backing in _HUGE for f in fixes
        )
        if not keeps_hugepages_ok and sgenv.sglang_env_failure(request.env) is None:
            f = Fix(
                "do not ask for hugepages: plain 4 KiB pages, which is what the host can give",
                [request.no_hugepages_change()],
                "no-hugepages",
                request=request.without_hugepages(),
            )
            run_fix(view, request, f)
            fixes.append(f)
    helping = [f for f in fixes if f.run and f.run.rank > baseline.rank]
    best = max((f.run.rank for f in helping if f.run), default=baseline.rank)
    if best < 3:
        per_category: dict[str, Fix] = {}
        pool = helping + ([f for f in fixes if f.category == "node"] if baseline.unbound else [])
        for f in pool:
            if f.category not in ("no-hugepages", "combined", "env"):
                per_category.setdefault(f.category, f)
        if len(per_category) > 1:
            combo = _combine(request, list(per_category.values()))
            run_fix(view, request, combo)
            fixes.append(combo)
            if combo.run and combo.run.rank > baseline.rank:
                helping.append(combo)
    helping.sort(key=lambda f: -(f.run.rank if f.run else 0))
    not_helping = [f for f in fixes if f not in helping]
    return helping, not_helping


_HUGE = ("AnonymousHugetlb", "AnonymousShmHugetlb")
