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
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from umbp_sim.diagnose.explain import gib, kernel_causes
from umbp_sim.diagnose.fix import COMPROMISES, HEAVY, Fix, combine
from umbp_sim.diagnose.fixes import candidates
from umbp_sim.diagnose.pool_writes import PoolWrite
from umbp_sim.diagnose.replay_request import Request
from umbp_sim.diagnose.simulate import Simulation, simulate_request
from umbp_sim.engine.host_changes import apply_change
from umbp_sim.machine import Machine
from umbp_sim.sim import HostState, SimHost

MAX_RUNS = 120  # simulations per diagnosis, a bound on the search


@dataclass
class Search:
    """The result of ``propose``: recommended sets, partial successes, and what did not help."""

    fixes: list[Fix]
    not_helping: list[Fix]
    limit: str | None = None
    runs: int = 0
    singles: list[Fix] = field(default_factory=list)  # every single change tried, with its run


def run_fix(machine: Machine, request: Request, fix: Fix, profile: str | None = None) -> Simulation:
    changes = tuple(fix.host_changes)
    # sglang restarted after a fix for its error line runs its host check again: a fix that
    # check would refuse is no fix.
    fix.run = simulate_request(
        fix.machine(machine), fix.request(request), changes, profile, request.sglang_raised
    )
    return fix.run


def host_after(machine: Machine, fix: Fix) -> HostState:
    """The simulated host as ``fix`` leaves it (its Machine change, then its admin writes):
    where the next step of a combination starts, so that step is sized on what is left. The
    state its own run kept; only a fix not run yet builds a host of its own to ask."""
    if fix.run is not None and fix.run.state is not None:
        return fix.run.state
    host = SimHost(fix.machine(machine).copy())
    for change in fix.host_changes:
        apply_change(host, change)
    return host.state()


def overwrites(fix: Fix) -> bool:
    """Two steps write the same pool file: the later one's value is all that is left."""
    targets = [c.target for c in fix.host_changes if isinstance(c, PoolWrite)]
    return len(targets) != len(set(targets))


def _next_steps(machine: Machine, request: Request, f: Fix) -> list[Fix]:
    """Candidates after ``f``: from its run's evidence, sized on the host it leaves."""
    assert f.run is not None
    after = f.machine(machine)
    steps = frozenset(s.key for s in f.singles)
    found = candidates(after, f.request(request), f.run)
    return [replace(g, sized_after=steps) for g in found]


def _value(f: Fix) -> tuple[int, int, int]:
    """Higher is better: outcome rank, fewer compromises, fewer changes."""
    assert f.run is not None
    return (f.run.rank, -f.compromises, -len(f.singles))


def propose(
    machine: Machine, request: Request, baseline: Simulation, profile: str | None = None,
    pod: bool = False,
) -> Search:  # fmt: skip
    """Search single changes and combinations; every returned fix was simulated. ``pod``: the
    server's hugetlb limit is a Kubernetes pod's (fixes.candidates)."""
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
        if overwrites(fix):
            return None
        if runs >= MAX_RUNS:
            return None
        runs += 1
        run_fix(machine, request, fix, profile)
        tried[key] = fix
        return fix

    singles = candidates(machine, request, baseline, pod=pod)
    for f in singles:
        trial(f)
    done = lambda: any(  # noqa: E731
        f.run and f.run.got_what_was_asked and not _pool_sized_for_another_request(f)
        for f in tried.values()
    )

    # Pairs of different kinds.
    for a, b in itertools.combinations(singles, 2):
        if a.category != b.category or a.category == "pool":
            trial(combine([a, b]))
    # Extend the singles that changed the outcome: their run shows the next obstacle.
    frontier = sorted(
        (f for f in singles if f.run and f.run.rank < 3 and _changed(f.run, baseline)),
        key=lambda f: -f.run.rank if f.run else 0,
    )[:3]
    # A switch to another hugepage size (the host's, where the asked one is not configured)
    # meets that size's own pool: its run says how many pages to reserve, even with the outcome
    # unchanged.
    frontier += [f for f in singles if f.category == "size" and f.run and f.run.rank < 3
                 and f not in frontier]  # fmt: skip
    for f in frontier:
        for g in _next_steps(machine, request, f):
            if g.key not in {s.key for s in f.singles}:
                trial(combine([f, g]))
    if not done():
        best = sorted(
            (
                f
                for f in tried.values()
                if len(f.singles) == 2
                and f.run
                and baseline.rank < f.run.rank < 3
                and not _pool_sized_for_another_request(f)
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
    helping = [
        f
        for f in tried.values()
        if f.run and f.run.rank > baseline.rank and not _pool_sized_for_another_request(f)
    ]
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
    # Safe sets first: one that leaves the rest of the server less than sglang keeps for it is
    # shown after them, with the figure (Fix.safety); then the better outcome and fewer
    # compromises (another node, a smaller pool); then changes to the server's own
    # configuration before changes every workload on the host lives with.
    minimal.sort(
        key=lambda f: (
            f.safety is None,
            f.run.rank if f.run else 0,
            -f.compromises,
            -len(f.host_wide),
            -len(f.singles),
        ),
        reverse=True,
    )
    # The smallest sets that get everything, then the best partial successes.
    full = [f for f in minimal if f.run and f.run.rank == 3]
    # Giving up what the buffer is for (hugepages, its size) only when no milder set, however
    # many steps it takes, gets everything: the host's own hugepage size and a pool for it
    # before plain pages.
    mild = [f for f in full if not any(s.category in HEAVY for s in f.singles)]
    full = mild or full
    if full:
        least = min(len(f.singles) for f in full)
        full = [f for f in full if len(f.singles) == least]
    # The partial successes shown carry no step they do without either: "always overcommit"
    # beside a buffer that fits without it is a host-wide change nothing needs.
    partial = [
        _without_moot_steps(f, trial) if len(f.singles) > 1 else f
        for f in minimal
        if f.run and f.run.rank < 3
    ]
    partial = list({frozenset(s.key for s in f.singles): f for f in partial}.values())
    # Partial successes (ok but unbound, demoted) only when nothing gets everything.
    minimal = full[:3] if full else partial[:3]
    mild_ok = any(
        f.run and f.run.rank == 3 and not any(s.category in HEAVY for s in f.singles)
        for f in minimal
    )
    if mild_ok:
        minimal = [f for f in minimal if not any(s.category in HEAVY for s in f.singles)]
    # What did not help, as a person would try it: every change to the host (pool, limits,
    # env), and a compromise (another node, size, buffer) only where it changed the outcome:
    # "bind to node 0 (0 free pages there)" on a host without hugepages is noise.
    not_helping = [
        f
        for f in singles
        if f.run is not None
        and f.run.rank <= baseline.rank
        and (f.category not in COMPROMISES or _changed(f.run, baseline))
    ]
    limit = None
    if not minimal:
        limit = _limit(baseline, [f for f in singles if f.run is not None])
    described = [_described(machine, f, tried, baseline) for f in minimal]
    return Search(described, not_helping, limit, runs, [f for f in singles if f.run is not None])


SHRINKS = ("buffer", "hicache")


def _pool_sized_for_another_request(fix: Fix) -> bool:
    """A pool step sized for the request as it was, beside a step that shrinks the request: a
    pool for 64 GiB next to ``--size 4GiB`` reserves memory nothing uses (the steps sized on
    the smaller request's own run are offered instead)."""
    shrinks = {s.key for s in fix.singles if s.category in SHRINKS}
    return bool(shrinks) and any(
        s.sized_for_buffer and not shrinks <= s.sized_after for s in fix.singles
    )


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


def _state_before(
    machine: Machine, parts: list[Fix], tried: dict[frozenset[str], Fix], baseline: Simulation
) -> HostState:
    """The host the steps ``parts`` leave: the state the baseline's run (no steps) or the
    steps' own trial kept."""
    if not parts:
        if baseline.state is not None:
            return baseline.state
        return host_after(machine, Fix("", [], ""))
    done = tried.get(frozenset(s.key for p in parts for s in p.singles))
    return host_after(machine, done if done is not None else combine(parts))


def _described(
    machine: Machine, fix: Fix, tried: dict[frozenset[str], Fix], baseline: Simulation
) -> Fix:
    """``fix`` with each step described on the host the steps before it leave (a step read
    from a run of steps no longer before it is said by its commands)."""
    if not fix.parts:
        return fix
    parts: list[Fix] = []
    for p in fix.parts:
        if p.describe is not None:
            before = _state_before(machine, parts, tried, baseline)
            p = replace(p, action=p.describe(before))
        elif not p.sized_after <= {q.key for q in parts}:
            p = replace(p, action="; ".join(p.commands))
        parts.append(p)
    out = combine(parts)
    out.run = fix.run
    return out


def _changed(run: Simulation, baseline: Simulation) -> bool:
    return (run.outcome, run.observed.error) != (baseline.outcome, baseline.observed.error)


def _limit(baseline: Simulation, tried: list[Fix]) -> str:
    """The rule that stands in the way: the last failure SimKernel (or sglang) recorded."""
    runs = [baseline] + [f.run for f in tried if f.run is not None]
    for run in runs:
        failing = [r for r in run.observed.reasons if r.errno or r.signal]
        if failing:
            causes = kernel_causes(failing[-1:], run)
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


__all__ = ["MAX_RUNS", "Search", "host_after", "overwrites", "propose", "run_fix"]
