"""Replay a request on a dumped host: what the user saw, why, and verified fixes.

    machine, facts = load_dump("host.tar.gz")
    d = diagnose(machine, facts, request)      # request: diagnose.request.Request
    print(render_text(d)); json.dumps(d.to_json())

Used by ``umbp-sim replay`` (a dump) and ``umbp-sim preflight`` (the live host).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from umbp_sim.diagnose.explain import Cause, explain
from umbp_sim.diagnose.fixes import Fix, propose
from umbp_sim.diagnose.request import Request, RequestError, add_request_arguments
from umbp_sim.diagnose.run import Run, simulate_request
from umbp_sim.dump import DumpFacts
from umbp_sim.machine import Machine


@dataclass
class Diagnosis:
    machine: Machine
    facts: DumpFacts | None
    request: Request
    run: Run
    evidence: list[Cause]
    fixes: list[Fix] = field(default_factory=list)
    not_helping: list[Fix] = field(default_factory=list)
    limit: str | None = None  # when no change helps: the rule in the way

    @property
    def causes(self) -> list[str]:
        return [c.text for c in self.evidence]

    @property
    def exit_code(self) -> int:
        """preflight's answer: 0 gets what it asks, 1 demoted (or unbound), 2 failed/crashed."""
        if self.run.outcome in ("failed", "crashed"):
            return 2
        return 0 if self.run.got_what_was_asked else 1

    def to_json(self) -> dict[str, Any]:
        o = self.run.observed
        return {
            "outcome": o.outcome,
            "actual_backing": o.actual_backing,
            "error": o.error,
            "signal": o.signal,
            "warnings": list(o.warnings),
            "causes": list(self.causes),
            "fixes": [f.to_json() for f in self.fixes],
            # extra keys
            "fixes_not_helping": [f.to_json() for f in self.not_helping],
            "limit": self.limit,
            "cause_sources": [c.source for c in self.evidence],
            "reasons": [r.to_json() for r in o.reasons],
            "got_what_was_asked": self.run.got_what_was_asked,
            "mapped_size": o.mapped_size,
            "crash_node": o.crash_node,
            "request": self.request.describe(),
            "machine": self.machine.name,
            "kernel_version": self.machine.kernel_version,
        }


def diagnose(
    machine: Machine, facts: DumpFacts | None, request: Request, profile: str | None = None
) -> Diagnosis:
    """Replay ``request`` on ``machine``, explain it from the run's evidence, search fixes.

    ``profile``: the allocator profile to model, passed to every simulated run.
    """
    run = simulate_request(machine, request, profile=profile)
    causes = explain(run, request, machine, facts)
    d = Diagnosis(machine, facts, request, run, causes)
    if run.rank < 3:
        found = propose(machine, request, run, profile)
        d.fixes, d.not_helping, d.limit = found.fixes, found.not_helping, found.limit
    return d


__all__ = [
    "Cause",
    "Diagnosis",
    "Fix",
    "Request",
    "RequestError",
    "Run",
    "add_request_arguments",
    "diagnose",
    "simulate_request",
]
