"""One simulated run of a request on a machine, through the scenario runner.

``simulate_request(machine, request, setup)`` builds a SimKernel from ``machine``, applies
``setup`` (admin writes such as ``host.set_nr_hugepages``), runs the request as the scenario
runner does (``umbp_sim.scenario.runner.observe``) and returns a :class:`Run`: the runner's
``Observed`` (with SimKernel's reasons) plus whether a NUMA binding was dropped and what the
setup left behind. Every simulated run of the diagnosis goes through ``run_allocator``, which
takes the allocator ``profile`` to model (None: the default).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from umbp_sim.allocator_spec import is_external
from umbp_sim.diagnose.request import Request
from umbp_sim.machine import Machine
from umbp_sim.scenario.runner import ALLOCATOR_LOGGER, Observed, observe
from umbp_sim.scenario.schema import Scenario
from umbp_sim.sim import SimHost

Setup = Callable[[SimHost], "str | None"]

# Outcome ranks: a fix is recommended only when its re-run ranks higher than the replay.
RANK = {"failed": 0, "crashed": 0, "demoted": 1, "ok": 3}
# The allocators' warnings that say a requested NUMA binding was dropped, by id
# (csrc/allocator/warning_texts.h; an external build's lines get theirs from
# umbp_sim.warning_ids).
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
class Run:
    request: Request
    observed: Observed
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
            text = f"demoted: {o.actual_backing} (4 KiB pages)"
        else:
            text = f"{o.outcome}: {o.error}"
        if self.setup_notes:
            text += " (" + "; ".join(self.setup_notes) + ")"
        return text


def run_allocator(
    scn: Scenario,
    machine: Machine,
    setup: Callable[[SimHost], None] | None,
    profile: str | None = None,
) -> Observed:
    """The one place the diagnosis runs the allocator: ``observe`` with the allocator profile
    (a request's scenario names its own, ``Request.allocator``, which wins), or, for an external
    build (``--allocator PATH|MODULE``), the same request in that allocator's process
    (``umbp_sim.external.observe``)."""
    allocator = profile or scn.allocator
    if allocator and is_external(allocator):
        from umbp_sim.external.observe import observe_external

        return observe_external(scn, machine, setup, allocator)
    return observe(scn, machine, setup, profile=profile)


def simulate_request(
    machine: Machine, request: Request, setup: Setup | None = None, profile: str | None = None
) -> Run:
    notes: list[str] = []

    def _setup(host: SimHost) -> None:
        if setup is not None:
            result = setup(host)
            if isinstance(result, str) and result:
                notes.append(result)

    obs = run_allocator(request.scenario(machine.name), machine, _setup, profile)
    return Run(request, obs, notes)
