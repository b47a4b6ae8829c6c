"""One simulated run of a request on a machine, through the run engine.

``simulate_request(machine, request, changes)`` runs the request (``Request.engine_run``) on a
fresh SimKernel built from ``machine`` with the admin writes ``changes`` applied first
(``host.set_nr_hugepages``: a fix's ``PoolWrite``) and returns a :class:`Simulation`: the engine's
``RunRecord`` (with SimKernel's reasons) plus whether a NUMA binding was dropped and what the
writes could not do. Every simulated run of the diagnosis goes through it; an external build
(``--allocator PATH|MODULE``) runs the same ``Run`` in its own process (``umbp_sim.run_router``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from umbp_sim.diagnose.replay_request import Request
from umbp_sim.engine.execute import ALLOCATOR_LOGGER
from umbp_sim.engine.record import NoRoom, RunRecord, RunTimedOut
from umbp_sim.engine.spec import HostChange
from umbp_sim.errors import UmbpSimError
from umbp_sim.machine import Machine
from umbp_sim.sim import HostState
from umbp_sim.vocabulary.units import spaced_size

# Outcome ranks: a fix is recommended only when its re-run ranks higher than the replay.
RANK = {"failed": 0, "crashed": 0, "demoted": 1, "ok": 3}
# The allocators' warnings that say a requested NUMA binding was dropped, by id
# (csrc/allocator/warning_texts.h; an external build's lines get theirs from
# umbp_sim.vocabulary.warning_ids).
UNBOUND_IDS = frozenset(
    {
        "numa-possible-unreadable",
        "numa-possible-unparsable",
        "numa-node-not-possible",
        "mbind-failed",
        "mori-mbind-failed",
    }
)


@dataclass
class Simulation:
    request: Request
    observed: RunRecord
    setup_notes: list[str] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        return self.observed.outcome

    @property
    def unbound_warning(self) -> tuple[str, str] | None:
        """The allocator's warning (id, text) that dropped the requested NUMA binding, if any."""
        return next(
            (
                (wid, text)
                for logger, wid, text in self.observed.log
                if logger == ALLOCATOR_LOGGER and wid in UNBOUND_IDS
            ),
            None,
        )

    @property
    def unbound(self) -> str | None:
        """Why the requested NUMA binding was dropped (the allocator's warning), else None."""
        node = self.request.settings()[2]
        if node < 0:
            return None
        o = self.observed
        warning = self.unbound_warning
        said = warning[1] if warning else None
        if o.bound_node is None:  # no buffer to look at (failed, crashed): what the log said
            return said
        if o.bound_node == node:
            return None
        return said or f"the buffer is not bound to node {node}"

    @property
    def state(self) -> HostState | None:
        """The host as this run's admin writes left it, before the allocation (None when an
        external build's process died before saying)."""
        return self.observed.host_state

    @property
    def base_pages(self) -> str:
        """The host's base page size, "4 KiB" (what a demoted buffer is on)."""
        return spaced_size(self.state.machine.page_size) if self.state else "base"

    @property
    def got_what_was_asked(self) -> bool:
        return self.outcome == "ok" and self.unbound is None

    @property
    def rank(self) -> int:
        r = RANK[self.outcome]
        return r - 1 if r == 3 and self.unbound else r

    def summary(self) -> str:
        """One line: the outcome and what made it, for a fix's ``outcome_after``."""
        o = self.observed
        if o.outcome == "ok":
            text = f"ok: {o.actual_backing}"
            node = self.request.settings()[2]
            if self.unbound:
                text += f", but not bound to node {node}"
            elif node >= 0:
                text += f" on node {node}"
        elif o.outcome == "demoted":
            text = f"demoted: {o.actual_backing} ({self.base_pages} pages)"
        else:
            text = f"{o.outcome}: {o.error}"
        if self.setup_notes:
            text += " (" + "; ".join(self.setup_notes) + ")"
        if o.ranks:
            text += f" [{ranks_summary(o.ranks)}]"
        return text


def ranks_summary(ranks: list[dict[str, Any]]) -> str:
    """Each rank's outcome, runs of equal ones together: "ranks 0-4 ok (AnonymousHugetlb);
    ranks 5-7 failed: RuntimeError: ..." (a rank after a crash was not simulated)."""
    groups: list[tuple[list[int], str]] = []
    for e in ranks:
        text = e["outcome"]
        if e["outcome"] in ("ok", "demoted") and e["actual_backing"]:
            text += f" ({e['actual_backing']}"
            text += f", DRAM tier {e['dram_tier']})" if e.get("dram_tier") else ")"
        elif e["error"]:
            text += f": {e['error']}"
        if groups and groups[-1][1] == text:
            groups[-1][0].append(e["rank"])
        else:
            groups.append(([e["rank"]], text))
    parts = []
    for ids, text in groups:
        which = f"rank {ids[0]}" if len(ids) == 1 else f"ranks {ids[0]}-{ids[-1]}"
        parts.append(f"{which} {text}")
    return "; ".join(parts)


def simulate_request(
    machine: Machine,
    request: Request,
    changes: Sequence[HostChange] = (),
    profile: str | None = None,
    host_check: bool = False,
) -> Simulation:
    """``request`` on ``machine`` after ``changes``, on ``profile`` (a profile or an external
    SPEC; default: the request's allocator); ``host_check``: an sglang error line's alloc
    behind sglang's host check (``Request.engine_run``). An external run past
    ``--run-timeout`` raises RunTimedOut, one whose process failed UmbpSimError, one without
    address space NoRoom."""
    from umbp_sim import run_router  # above the engine: on the first run, not at import

    allocator = profile or request.allocator
    try:
        run = request.engine_run(machine, allocator, tuple(changes), host_check)
        run = replace(run, keep_state=True)
        rec = run_router.run(run)
    except NoRoom as e:
        raise NoRoom(f"--allocator {allocator}: {e}") from None
    if rec.outcome == "timeout":
        raise RunTimedOut(f"--allocator {allocator}: a run {rec.error} (--run-timeout)")
    if rec.outcome == "could-not-run":
        raise UmbpSimError(f"the allocator's process failed: {rec.error}")
    return Simulation(request, rec, rec.setup_notes)
