"""Replay a request on a dumped host: what the user saw, why, and verified fixes.

    machine, facts = load_dump("host.tar.gz")
    d = diagnose(machine, facts, request)      # request: diagnose.request.Request
    print(render_text(d)); json.dumps(d.to_json())

Used by ``umbp-sim replay`` (a dump) and ``umbp-sim preflight`` (the live host).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from umbp_sim.allocator_profiles import (
    FIELD_PROFILE,
    FIXED_PROFILE,
    canonical_profile,
    mori_log_lines,
)
from umbp_sim.vocabulary import _lazy
from umbp_sim.vocabulary.exit_codes import EX_FAILS, EX_NEGATIVE, EX_OK

# The simulation (explain, fixes, run: the allocator and the compiled extension) is imported
# when a diagnosis is made, not with the package: `replay --help` and a usage error need only
# the request's flags (umbp_sim/diagnose/request_flags.py). The imports from this package's
# modules below are what it offers (umbp_sim/vocabulary/_lazy.py reads them for __getattr__).
if TYPE_CHECKING:
    from umbp_sim.diagnose.explain import Cause as Cause
    from umbp_sim.diagnose.fix import Fix as Fix
    from umbp_sim.diagnose.hypotheses import HypothesisSearch as HypothesisSearch
    from umbp_sim.diagnose.replay_request import Request as Request, RequestError as RequestError
    from umbp_sim.diagnose.request_flags import add_request_arguments as add_request_arguments
    from umbp_sim.diagnose.simulate import (
        Simulation as Simulation,
        simulate_request as simulate_request,
    )
    from umbp_sim.dump import DumpFacts
    from umbp_sim.machine import Machine


def __getattr__(name: str) -> Any:
    if name == "Run":  # engine.spec.Run is the run; this was a simulation's result
        warnings.warn("umbp_sim.diagnose.Run is deprecated: use umbp_sim.diagnose.Simulation",
                      DeprecationWarning, stacklevel=2)  # fmt: skip
        name = "Simulation"
    return _lazy.attribute(__name__, name, "Diagnosis", "diagnose")


@dataclass
class Diagnosis:
    machine: Machine
    facts: DumpFacts | None
    request: Request
    run: Simulation
    evidence: list[Cause]
    fixes: list[Fix] = field(default_factory=list)
    not_helping: list[Fix] = field(default_factory=list)
    # The same request under umbp-sim's fixed allocator, when its outcome differs.
    with_fixes: Simulation | None = None
    limit: str | None = None  # when no change helps: the rule in the way
    # An error line the replay does not reproduce: the host states a dump cannot show that do.
    hypotheses: HypothesisSearch | None = None
    # What stands in the way behind the first blocker: what a single host change meets once it
    # has removed the one the replay met (explain.blockers_behind).
    behind: list[Cause] = field(default_factory=list)

    @property
    def causes(self) -> list[str]:
        return [c.text for c in self.evidence]

    @property
    def exit_code(self) -> int:
        """preflight's answer: 0 gets what it asks, 1 demoted (or unbound), 2 failed/crashed."""
        if self.run.outcome in ("failed", "crashed"):
            return EX_FAILS
        return EX_OK if self.run.got_what_was_asked else EX_NEGATIVE

    def to_json(self) -> dict[str, Any]:
        from umbp_sim.diagnose.margin import margin
        from umbp_sim.diagnose.persist import persistent

        o = self.run.observed
        return {
            "outcome": o.outcome,
            "actual_backing": o.actual_backing,
            "error": o.error,
            "signal": o.signal,
            "warnings": list(o.warnings),
            "causes": list(self.causes),
            "blockers_behind": [c.text for c in self.behind],
            "fixes": [
                {
                    **f.to_json(),
                    "persistent": persistent(f, self.machine),
                    "margin": margin(f.run),
                    "rank_outcomes": list(f.run.observed.ranks) if f.run else [],
                }
                for f in self.fixes
            ],
            # extra keys
            "fixes_not_helping": [f.to_json() for f in self.not_helping],
            "limit": self.limit,
            "cause_sources": [c.source for c in self.evidence],
            "cause_note_codes": [c.note_code for c in self.evidence],  # a dump note's code
            "reasons": [r.to_json() for r in o.reasons],
            "got_what_was_asked": self.run.got_what_was_asked,
            "mapped_size": o.mapped_size,
            "crash_node": o.crash_node,
            "request": self.request.describe(),
            "ranks": self.request.ranks,
            "rank_outcomes": list(o.ranks),
            "machine": self.machine.name,
            "kernel_version": self.machine.kernel_version,
            "allocator": self.request.allocator,
            "sglang": self.request.sglang_release if self.request.kind == "sglang" else None,
            "log": log_lines(self),
            "reproduces_error_line": (
                self.request.error_line.matches(o) if self.request.error_line else None
            ),
            "symptom": _symptom_json(self),
            "hypotheses": self.hypotheses.to_json() if self.hypotheses else None,
            # every guess the dump reader made (the causes keep those that change the answer),
            # and a paste's values with their lines (umbp_sim/dump/paste.py)
            "dump_notes": (
                [{"code": n.code, "text": str(n)} for n in self.facts.notes] if self.facts else []
            ),
            "paste": self.facts.to_json().get("paste") if self.facts else None,
            "with_umbp_sim_fixes": (
                {
                    "outcome": self.with_fixes.outcome,
                    "actual_backing": self.with_fixes.observed.actual_backing,
                    "summary": self.with_fixes.summary(),
                }
                if self.with_fixes
                else None
            ),
        }


def _pod(facts: DumpFacts | None) -> bool:
    """The dump's hugetlb limits are a Kubernetes pod's (its fixes are in the pod spec)."""
    from umbp_sim.dump.paste import pod_hugetlb_limits

    return facts is not None and pod_hugetlb_limits(facts)


def _symptom_json(d: Diagnosis) -> dict[str, Any] | None:
    """The symptom asked about, and whether the replay on the host as dumped gives it."""
    symptom = d.request.symptom
    if symptom is None:
        return None
    return {**symptom.to_json(), "reproduced": symptom.seen(d.run.observed)}


def log_lines(d: Diagnosis) -> list[str]:
    """What the server's log showed of the allocator: mori's log at its level, else every line."""
    o = d.run.observed
    if d.request.allocator == FIELD_PROFILE:
        return mori_log_lines(o.allocator_warnings, d.request.env)
    return list(o.allocator_warnings)


def _with_fixes(machine: Machine, request: Request, run: Simulation) -> Simulation | None:
    from umbp_sim.diagnose.simulate import simulate_request

    if request.allocator == FIXED_PROFILE:
        return None
    other = simulate_request(machine, request.with_allocator(FIXED_PROFILE))
    same = (other.outcome, other.observed.actual_backing, other.unbound is None) == (
        run.outcome,
        run.observed.actual_backing,
        run.unbound is None,
    )
    return None if same else other


def diagnose(
    machine: Machine, facts: DumpFacts | None, request: Request, profile: str | None = None
) -> Diagnosis:
    """Replay ``request`` on ``machine``, explain it from the run's evidence, search fixes.

    ``profile``: the allocator profile to model (default: the request's, ``--allocator``),
    passed to every simulated run.
    """
    from umbp_sim.diagnose.explain import blockers_behind, explain
    from umbp_sim.diagnose.fix_search import propose
    from umbp_sim.diagnose.hypotheses import search
    from umbp_sim.diagnose.simulate import simulate_request
    from umbp_sim.diagnose.symptom_causes import symptom_search
    from umbp_sim.diagnose.unknowns import other_sides

    if profile is not None:
        request = request.with_allocator(canonical_profile(profile))
    profile = request.allocator
    run = simulate_request(machine, request, profile=profile)
    causes = explain(run, request, machine, facts)
    causes += other_sides(machine, facts, request, run, profile)  # a paste's unknown kernel
    d = Diagnosis(machine, facts, request, run, causes)
    if run.rank < 3:
        found = propose(machine, request, run, profile, pod=_pod(facts))
        d.fixes, d.not_helping, d.limit = found.fixes, found.not_helping, found.limit
        d.behind = blockers_behind(run, found.singles)
    d.with_fixes = _with_fixes(machine, request, run)
    if request.error_line is not None and not request.error_line.matches(run.observed):
        d.hypotheses = search(machine, facts, request, run.outcome, profile)
    # A symptom the host as dumped does not give (an "ok" host too): its hidden causes.
    if request.symptom is not None and not request.symptom.seen(run.observed):
        d.hypotheses = symptom_search(machine, facts, request, run.outcome, profile)
    return d
