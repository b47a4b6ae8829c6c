"""Text and JSON forms of a Diagnosis (the JSON keys are issue 6's, plus extra ones)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from umbp_sim.allocator_profiles import FIELD_PROFILE, FIXED_PROFILE, mori_log_level
from umbp_sim.diagnose import Diagnosis, log_lines
from umbp_sim.diagnose.hypotheses import HypothesisSearch
from umbp_sim.diagnose.margin import margin
from umbp_sim.diagnose.persist import persistent
from umbp_sim.diagnose.replay_request import Request
from umbp_sim.diagnose.simulate import ranks_summary
from umbp_sim.machine import Machine
from umbp_sim.sglang.release import describe_release
from umbp_sim.vocabulary.printable import printable
from umbp_sim.vocabulary.units import spaced_size

_ALLOCATOR = {
    FIELD_PROFILE: f"{FIELD_PROFILE} (mori's HostMemAllocator as deployed, ROCm/mori 624002c)",
    FIXED_PROFILE: f"{FIXED_PROFILE} (mori's allocator plus umbp-sim's fixes)",
}

_SAW = {
    "ok": "ok: the request got what it asked for",
    "demoted": "demoted: hugepages were asked for, the buffer is on {base} pages",
    "failed": "failed: the server dies at startup",
    "crashed": "crashed: the process is killed by a signal",
}


@dataclass(frozen=True)
class FixLine:
    action: str
    commands: list[str]
    outcome_after: str
    persistent: list[str]  # what makes the commands last past a reboot (diagnose.persist)
    margin: str | None  # what the fix leaves on the buffer's nodes (diagnose.margin)
    host_wide: list[str] = field(default_factory=list)  # steps the whole host lives with
    safety: str | None = None  # why applying it leaves the rest of the server short (Fix.safety)


@dataclass(frozen=True)
class HypothesisLine:
    """A verified hypothesis for an error line the dump does not reproduce, as shown."""

    cause: str
    verified: str  # the change and "the line, exactly"
    beyond: str | None  # the change just past the edge and what it gives
    collect: list[str]  # what to collect to confirm it
    fix: list[str] = field(default_factory=list)  # what to change if it is confirmed


@dataclass(frozen=True)
class Sections:
    """A diagnosis as the report shows it, section by section: what the text and the HTML page
    both render (never one read back from the other)."""

    heading: str  # "replay of ..." / "preflight of ..."
    host: str
    allocator: str
    sglang: str | None
    saw_title: str
    outcome: str  # ok / demoted / failed / crashed: the page colours it
    saw: str
    saw_lines: list[str]  # backing, error, the error line given, the log
    causes: list[str]
    # An error line not reproduced: what opens the search, its hypotheses, what it ruled out.
    hypotheses_intro: str | None
    hypotheses: list[HypothesisLine]
    ruled_out: list[str]
    ruled_out_of: str  # what the ruled-out changes do not give: "the line", a symptom
    fixes: list[FixLine]
    no_fix: str | None  # why there is no fix (nothing to change / none helps)
    not_helping: list[FixLine]
    with_fixes: str | None


def sections(d: Diagnosis, mode: str = "replay") -> Sections:
    o = d.run.observed
    saw = _SAW[o.outcome].format(base=d.run.base_pages)
    if o.outcome == "ok" and d.run.unbound:
        saw = "ok, but the NUMA binding was dropped"
    saw_lines = []
    if o.actual_backing:
        saw_lines.append(f"actual backing: {o.actual_backing}, mapped {o.mapped_size} bytes")
    if o.error:
        saw_lines.append(f"error: {o.error}")
    line = d.request.error_line
    if line is not None:
        reproduced = line.matches(o)
        saw_lines.append(
            "the error line given: " + ("reproduced exactly" if reproduced else "NOT reproduced")
        )
        if not reproduced:
            saw_lines.append(f"  given: {line.text}")
    if d.request.symptom is not None:
        symptom = d.request.symptom
        seen = "reproduced" if symptom.seen(d.run.observed) else "NOT reproduced"
        saw_lines.append(f"the symptom given: {symptom.said}: {seen}")
    if len(o.ranks) > 1:
        saw_lines.append(f"{len(o.ranks)} ranks on this host, in the order they start: "
                         f"{ranks_summary(o.ranks)}")  # fmt: skip
    elif o.ranks:
        saw_lines.append(f"with mori's DRAM tier: {ranks_summary(o.ranks)}")
    saw_lines += _log_section(d)
    no_fix = None
    if d.run.got_what_was_asked and d.hypotheses is not None and d.request.symptom is not None:
        no_fix = (
            "nothing on the host as dumped: the request gets what it asks for on it; what to "
            "change is each hypothesis's above, once collecting confirms it"
        )
    elif d.run.got_what_was_asked:
        no_fix = "nothing: the request gets what it asks for on this host"
    elif not d.fixes:
        no_fix = "no change tried in simulation makes it better" + (
            f"; the limit in the way: {d.limit}" if d.limit else ""
        )
    elif all(f.safety for f in d.fixes):
        no_fix = (
            "no safe change: each change that helps in simulation leaves the rest of the "
            "server less than sglang keeps for it (below, not recommended)"
        )

    def fix_lines(fixes: list) -> list[FixLine]:  # type: ignore[type-arg]
        return [
            FixLine(
                f.action,
                list(f.commands),
                f.outcome_after,
                persistent(f, d.machine),
                margin(f.run),
                f.host_wide,
                f.safety,
            )
            for f in fixes
        ]

    intro, hypotheses, ruled_out = hypothesis_lines(d.hypotheses)
    return Sections(
        heading=f"{mode} of {d.request.describe()}",
        host=f"{printable(d.machine.name)} (kernel {printable(d.machine.kernel_version)})",
        allocator=_ALLOCATOR.get(d.request.allocator, d.request.allocator),
        sglang=describe_release(d.request.sglang_release) if d.request.kind == "sglang" else None,
        saw_title="what the server will see" if mode == "preflight" else "what the user saw",
        outcome=o.outcome,
        saw=saw,
        saw_lines=saw_lines,
        causes=list(d.causes) + [c.text for c in d.behind],
        hypotheses_intro=intro,
        hypotheses=hypotheses,
        ruled_out=ruled_out,
        ruled_out_of=("the line" if d.request.symptom is None else d.request.symptom.short),
        fixes=fix_lines(d.fixes),
        no_fix=no_fix,
        not_helping=fix_lines(d.not_helping),
        with_fixes=d.with_fixes.summary() if d.with_fixes is not None else None,
    )


def hypothesis_lines(
    found: HypothesisSearch | None, on: str = "the host as dumped"
) -> tuple[str | None, list[HypothesisLine], list[str]]:
    """The search's opening sentence, its hypotheses and what it ruled out, as shown."""
    if found is None:
        return None, [], []
    runs = f"{len(found.tried)} simulated runs in all, probes included"
    exactly = " exactly" if found.asked == "the error line" else ""
    if found.hypotheses:
        intro = (
            f"{on} does not give {found.asked}; changed in what a dump cannot show "
            f"({runs}), the host gives it{exactly} if:"
        )
    else:
        intro = (
            f"{on} does not give {found.asked}, and nothing umbp-sim models that a dump "
            f"cannot show gives it ({runs})"
        )
    shown = [
        HypothesisLine(
            h.cause,
            f"{h.verified.change}: {found.got}"
            + ("" if found.asked == "the error line" else f" ({h.verified.summary})"),
            f"{h.beyond.change}: {h.beyond.summary}" if h.beyond else None,
            list(h.collect),
            list(h.fix),
        )
        for h in found.hypotheses
    ]
    return intro, shown, [f"{t.change}: {t.summary}" for t in found.ruled_out]


def hypothesis_text(intro: str | None, hypotheses: list[HypothesisLine],
                    ruled_out: list[str], what: str = "the line") -> list[str]:  # fmt: skip
    """The hypotheses as the text report's lines (indented for section 2)."""
    if intro is None:
        return []
    lines = [f"   {intro}"]
    for i, h in enumerate(hypotheses):
        letter = chr(ord("a") + i) if i < 26 else str(i + 1)
        lines.append(f"   {letter}. {h.cause}")
        lines.append(f"      simulated: {h.verified}")
        if h.beyond:
            lines.append(f"      just past it: {h.beyond}")
        for i, c in enumerate(h.collect):
            lines.append(f"      {'to confirm: ' if i == 0 else '            '}{c}")
        for i, c in enumerate(h.fix):
            lines.append(f"      {'to fix: ' if i == 0 else '        '}{c}")
    if ruled_out:
        lines.append(f"   does not give {what} (simulated):")
        lines += [f"   - {x}" for x in ruled_out]
    return lines


def _fix_text(bullet: str, f: FixLine) -> list[str]:
    """One fix as the text report shows it: its action, commands and what the run left."""
    lines = [f"   {bullet} {f.action}"]
    lines += [f"        {c}" for c in f.commands]
    lines += [f"      after a reboot too: {p}" for p in f.persistent]
    lines.append(f"      simulated: {f.outcome_after}")
    if f.margin:
        lines.append(f"      leaves: {f.margin}")
    if f.host_wide:
        wide = "; ".join(f.host_wide)
        lines.append(f"      host-wide, every workload on the host lives with: {wide}")
    if f.safety:
        lines.append(f"      {f.safety}")
    return lines


def render_text(d: Diagnosis, mode: str = "replay") -> str:
    """The report; ``mode`` "preflight" words it as a prediction for a server not started yet."""
    s = sections(d, mode)
    lines = [s.heading, f"on {s.host}", f"allocator: {s.allocator}"]
    if s.sglang is not None:
        lines.append(f"sglang: {s.sglang}")
    lines += ["", f"1. {s.saw_title}", f"   outcome: {s.saw}"]
    lines += [f"   {x}" for x in s.saw_lines]
    lines += ["", "2. why"]
    lines += hypothesis_text(s.hypotheses_intro, s.hypotheses, s.ruled_out, s.ruled_out_of)
    if s.hypotheses_intro is not None:
        lines.append("   on the host as dumped:")
    lines += [f"   - {c}" for c in s.causes] or ["   - nothing to explain"]
    lines += ["", "3. what to change"]
    if s.no_fix is not None:
        lines.append(f"   {s.no_fix}")
    numbered = [f for f in s.fixes if not f.safety]
    unsafe = [f for f in s.fixes if f.safety]
    for i, f in enumerate(numbered, 1):
        lines += _fix_text(f"{i}.", f)
    if unsafe:
        lines += ["", "   unsafe, not recommended (the figure says why):"]
        for f in unsafe:
            lines += _fix_text("-", f)
    if s.not_helping:
        lines += ["", "   tried in simulation, does not help:"]
        for f in s.not_helping:
            lines.append(f"   - {f.action}: {' ; '.join(f.commands)}")
            lines.append(f"      simulated: {f.outcome_after}")
    if s.with_fixes is not None:
        lines += [
            "",
            "4. with umbp-sim's allocator fixes (--allocator umbp-sim)",
            f"   simulated: {s.with_fixes}",
        ]
    return "\n".join(lines)


def _log_section(d: Diagnosis) -> list[str]:
    o = d.run.observed
    other = [w for w in o.warnings if w not in o.allocator_warnings]
    out = [f"sglang warning: {w}" for w in other]
    if d.request.allocator != FIELD_PROFILE:
        return out + [f"allocator warning: {w}" for w in o.allocator_warnings]
    shown = log_lines(d)
    level = mori_log_level(d.request.env)
    if o.allocator_warnings and not shown:
        out.append(
            f"mori's log (level {level}, the default): nothing; with MORI_UMBP_LOG_LEVEL=warn "
            f"it would print {len(o.allocator_warnings)} line(s):"
        )
        out += [f"  {w}" for w in o.allocator_warnings]
    else:
        out += [f"mori's log: {w}" for w in shown]
    return out


def render_json(d: Diagnosis) -> str:
    return json.dumps(d.to_json(), indent=2)


def _reference(machine: Machine) -> str:
    nodes = machine.nodes
    return (
        f"{machine.arch}, {len(nodes)} nodes of {spaced_size(nodes[0].mem_total)}, no hugepages "
        f"reserved, overcommit_memory {machine.overcommit_memory}, no limits, kernel "
        f"{machine.kernel_version}"
    )


def render_line_hosts(request: Request, machine: Machine, found: HypothesisSearch) -> str:
    """``replay --error LINE`` with no dump: the kinds of host on which the line happens."""
    assert request.error_line is not None
    intro, hypotheses, ruled_out = hypothesis_lines(found, "the reference host")
    lines = [
        f"hosts on which this line happens: {request.error_line.text}",
        f"request: {request.describe()}",
        f"allocator: {_ALLOCATOR.get(request.allocator, request.allocator)}",
        f"simulated on a reference host: {_reference(machine)}",
        "",
    ]
    if any(h.kind == "any_host" for h in found.hypotheses):
        lines.append(f"   {found.hypotheses[0].cause}")
        lines.append(f"      simulated: {hypotheses[0].verified}")
    else:
        lines += hypothesis_text(intro, hypotheses, ruled_out)
    lines += [
        "",
        "with the server's host dump (umbp-sim collect, or collect --pid PID of a running "
        "server), `umbp-sim replay DUMP --error LINE` checks these against that host",
    ]
    return "\n".join(lines)


def line_hosts_json(request: Request, machine: Machine, found: HypothesisSearch) -> dict[str, Any]:
    assert request.error_line is not None
    return {
        "error_line": request.error_line.text,
        "request": request.describe(),
        "allocator": request.allocator,
        "reference_host": _reference(machine),
        **found.to_json(),
    }
