"""Text and JSON forms of a Diagnosis (the JSON keys are issue 6's, plus extra ones)."""

from __future__ import annotations

import json

from umbp_sim.diagnose import Diagnosis, log_lines
from umbp_sim.printable import printable
from umbp_sim.profiles import FIELD_PROFILE, mori_log_level
from umbp_sim.sglang.release import describe_release

_ALLOCATOR = {
    "mori-624002c": "mori-624002c (mori's HostMemAllocator as deployed, ROCm/mori 624002c)",
    "umbp-sim": "umbp-sim (mori's allocator plus umbp-sim's fixes)",
}

_SAW = {
    "ok": "ok: the request got what it asked for",
    "demoted": "demoted: hugepages were asked for, the buffer is on 4 KiB pages",
    "failed": "failed: the server dies at startup",
    "crashed": "crashed: the process is killed by a signal",
}


def render_text(d: Diagnosis, mode: str = "replay") -> str:
    """The report; ``mode`` "preflight" words it as a prediction for a server not started yet."""
    o = d.run.observed
    saw = _SAW[o.outcome]
    if o.outcome == "ok" and d.run.unbound:
        saw = "ok, but the NUMA binding was dropped"
    lines = [
        f"{mode} of {d.request.describe()}",
        f"on {printable(d.machine.name)} (kernel {printable(d.machine.kernel_version)})",
        f"allocator: {_ALLOCATOR.get(d.request.allocator, d.request.allocator)}",
    ]
    if d.request.kind == "sglang":
        lines.append(f"sglang: {describe_release(d.request.sglang_release)}")
    saw_head = "1. what the server will see" if mode == "preflight" else "1. what the user saw"
    lines += ["", saw_head, f"   outcome: {saw}"]
    if o.actual_backing:
        lines.append(f"   actual backing: {o.actual_backing}, mapped {o.mapped_size} bytes")
    if o.error:
        lines.append(f"   error: {o.error}")
    line = d.request.error_line
    if line is not None:
        lines.append(
            "   the error line given: "
            + ("reproduced exactly" if line.matches(o.error) else "NOT reproduced")
        )
        if not line.matches(o.error):
            lines.append(f"     given: {line.text}")
    lines += _log_section(d)
    lines += ["", "2. why"]
    lines += [f"   - {c}" for c in d.causes] or ["   - nothing to explain"]
    lines += ["", "3. what to change"]
    if d.run.got_what_was_asked:
        lines.append("   nothing: the request gets what it asks for on this host")
    elif not d.fixes:
        lines.append(
            "   no change tried in simulation makes it better"
            + (f"; the limit in the way: {d.limit}" if d.limit else "")
        )
    for i, f in enumerate(d.fixes, 1):
        lines.append(f"   {i}. {f.action}")
        lines += [f"        {c}" for c in f.commands]
        lines.append(f"      simulated: {f.outcome_after}")
    if d.not_helping:
        lines += ["", "   tried in simulation, does not help:"]
        for f in d.not_helping:
            lines.append(f"   - {f.action}: {' ; '.join(f.commands)}")
            lines.append(f"      simulated: {f.outcome_after}")
    if d.with_fixes is not None:
        lines += [
            "",
            "4. with umbp-sim's allocator fixes (--allocator umbp-sim)",
            f"   simulated: {d.with_fixes.summary()}",
        ]
    return "\n".join(lines)


def _log_section(d: Diagnosis) -> list[str]:
    o = d.run.observed
    other = [w for w in o.warnings if w not in o.allocator_warnings]
    out = [f"   sglang warning: {w}" for w in other]
    if d.request.allocator != FIELD_PROFILE:
        return out + [f"   allocator warning: {w}" for w in o.allocator_warnings]
    shown = log_lines(d)
    level = mori_log_level(d.request.env)
    if o.allocator_warnings and not shown:
        out.append(
            f"   mori's log (level {level}, the default): nothing; with MORI_UMBP_LOG_LEVEL=warn "
            f"it would print {len(o.allocator_warnings)} line(s):"
        )
        out += [f"     {w}" for w in o.allocator_warnings]
    else:
        out += [f"   mori's log: {w}" for w in shown]
    return out


def render_json(d: Diagnosis) -> str:
    return json.dumps(d.to_json(), indent=2)
