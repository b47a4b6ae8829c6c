"""A scenario's result (``ScenarioResult``: its run's ``RunRecord`` and what differed) and how a
record is compared with ``[expect]``. ``umbp_sim.scenario.scenario_run`` re-exports them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from umbp_sim.engine.record import RunRecord
from umbp_sim.scenario.regex import MATCH_CPU_SECONDS, RegexTimeout, bounded_search
from umbp_sim.scenario.schema import Scenario, ScenarioError
from umbp_sim.vocabulary.units import parse_size


@dataclass
class ScenarioResult:
    scenario: Scenario
    observed: RunRecord | None  # None: not run
    mismatches: list[str]
    not_run: str | None = None  # why the scenario could not run on the allocator asked for

    @property
    def passed(self) -> bool:
        return not self.mismatches and self.not_run is None

    def report(self) -> str:
        """What differed, then the syscall trace: the failure report of a scenario."""
        lines = [f"{self.scenario.path}: {self.scenario.name}"]
        lines += [f"  {m}" for m in self.mismatches]
        if self.observed is None:
            return "\n".join(lines)
        if self.observed.warnings:
            lines.append("  warnings:")
            lines += [f"    {w}" for w in self.observed.warnings]
        if self.observed.trace:
            lines.append("  syscall trace:")
            lines += [f"    {t}" for t in self.observed.trace_text().splitlines()]
        return "\n".join(lines)


# ---- comparing ---------------------------------------------------------------------------------
def _regex_matches(pattern: str, error: str | None, path: object) -> bool:
    try:
        return bounded_search(pattern, error or "")
    except RegexTimeout:
        raise ScenarioError(
            f"{path}: [expect].error_regex: matching took more than {MATCH_CPU_SECONDS:g} s of "
            f"CPU on a {len(error or ''):,}-character error (the pattern backtracks: fewer "
            "wildcards such as .* in a row)"
        ) from None


def compare(expect: dict[str, Any], obs: RunRecord, path: object = "<scenario>") -> list[str]:
    """Each way the observation differs from the expectation, one line each.

    ``error_regex`` is matched within its CPU bound (``umbp_sim.scenario.regex``): past it, a
    ScenarioError naming ``path`` and the key, not a hang."""
    out: list[str] = []

    def differ(what: str, want: Any, got: Any) -> None:
        if want != got:
            out.append(f"{what}: expected {want!r}, got {got!r}")

    differ("outcome", expect["outcome"], obs.outcome)
    if "actual_backing" in expect:
        differ("actual_backing", expect["actual_backing"], obs.actual_backing)
    if "mapped_size" in expect:
        differ("mapped_size", parse_size(expect["mapped_size"], "mapped_size"), obs.mapped_size)
    if "error" in expect:
        differ("error", expect["error"], obs.error)
    if "error_regex" in expect and not _regex_matches(expect["error_regex"], obs.error, path):
        out.append(f"error: {obs.error!r} does not match /{expect['error_regex']}/")
    if "signal" in expect:
        differ("signal", expect["signal"], obs.signal)
    if "crash_node" in expect:
        differ("crash_node", expect["crash_node"], obs.crash_node)
    for want in expect.get("warnings", []):
        if not any(want in w for w in obs.warnings):
            out.append(f"warnings: none contains {want!r}")
    if expect.get("no_warnings") and obs.warnings:
        out.append(f"warnings: expected none, got {obs.warnings!r}")
    for key, want in expect.get("counters", {}).items():
        differ(f"counters.{key}", want, obs.counters.get(key))
    if "steps" in expect:
        differ("steps", expect["steps"], obs.steps)
    if expect.get("no_leaks") and obs.leaks:
        out.append(f"leaks: {'; '.join(obs.leaks)}")
    return out
