"""What one scenario run observed (``Observed``), the result (``ScenarioResult``), the host
counters ``[expect].counters`` names, and how an observation is compared with ``[expect]``.
``umbp_sim.scenario.runner`` re-exports them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from umbp_sim.errors import UmbpSimError
from umbp_sim.log_capture import LogEntry
from umbp_sim.scenario.regex import MATCH_CPU_SECONDS, RegexTimeout, bounded_search
from umbp_sim.scenario.schema import Scenario, ScenarioError
from umbp_sim.sim import SimHost
from umbp_sim.units import parse_size

_COUNTER_RE = re.compile(
    r"^(?:node(?P<node>\d+)\.)?hugepages\.(?P<size>[0-9A-Za-z]+)\.(?P<field>total|free|reserved|surplus)$"
)


@dataclass
class Observed:
    outcome: str
    actual_backing: str | None = None
    mapped_size: int | None = None
    bound_node: int | None = None  # the node mbind bound the (last) buffer to, -1 if none
    error: str | None = None
    signal: str | None = None
    crash_node: int | None = None
    warnings: list[str] = field(default_factory=list)
    # The allocator's own lines among the warnings (what mori's log would carry).
    allocator_warnings: list[str] = field(default_factory=list)
    # Every warning as (logger, warning id or None, text): sglang's own lines are under
    # "sglang.", the allocator's carry their ids (umbp_sim.log_capture).
    log: list[LogEntry] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    steps: list[str] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)
    trace: str = ""
    # SimKernel's recorded reasons (umbp_sim.sim.Reason), and what sglang's host check read.
    reasons: list[Any] = field(default_factory=list)
    budget: dict[str, int] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "actual_backing": self.actual_backing,
            "mapped_size": self.mapped_size,
            "error": self.error,
            "signal": self.signal,
            "crash_node": self.crash_node,
            "warnings": self.warnings,
            "counters": self.counters,
            "steps": self.steps,
            "leaks": self.leaks,
        }


@dataclass
class ScenarioResult:
    scenario: Scenario
    observed: Observed
    mismatches: list[str]
    not_run: str | None = None  # why the scenario could not run on the allocator asked for

    @property
    def passed(self) -> bool:
        return not self.mismatches and self.not_run is None

    def report(self) -> str:
        """What differed, then the syscall trace: the failure report of a scenario."""
        lines = [f"{self.scenario.path}: {self.scenario.name}"]
        lines += [f"  {m}" for m in self.mismatches]
        if self.observed.warnings:
            lines.append("  warnings:")
            lines += [f"    {w}" for w in self.observed.warnings]
        if self.observed.trace:
            lines.append("  syscall trace:")
            lines += [f"    {t}" for t in self.observed.trace.splitlines()]
        return "\n".join(lines)


def read_counters(scn: Scenario, host: SimHost) -> dict[str, int]:
    """The counters ``scn``'s ``[expect].counters`` names, read from ``host`` now."""
    out: dict[str, int] = {}
    for key in scn.expect.get("counters", {}):
        try:
            out[key] = _counter(host, key)
        except KeyError:
            raise ScenarioError(
                f"{scn.path}: [expect].counters.{key}: no such counter (use "
                "hugepages.<size>.<total|free|reserved|surplus>, "
                "node<N>.hugepages.<size>.<total|free|surplus> or meminfo.<Field>)"
            ) from None
        except (UmbpSimError, ValueError) as e:  # a size or node this host does not have
            raise ScenarioError(f"{scn.path}: [expect].counters.{key}: {e}") from None
    return out


def _counter(host: SimHost, key: str) -> int:
    if key.startswith("meminfo."):
        name = key.removeprefix("meminfo.")
        info = host.meminfo()
        if name not in info:
            raise KeyError(key)
        return info[name]
    m = _COUNTER_RE.match(key)
    if not m:
        raise KeyError(key)
    if m.group("node") is not None and m.group("field") == "reserved":
        raise KeyError(key)  # the kernel keeps no per-node Rsvd (docs/kernel-model.md 0)
    size = parse_size(m.group("size"), key)
    pages = (
        host.node_hugepages(int(m.group("node")), size)
        if m.group("node") is not None
        else host.hugepages(size)
    )
    return int(getattr(pages, m.group("field")))


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


def compare(expect: dict[str, Any], obs: Observed, path: object = "<scenario>") -> list[str]:
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
