"""Text and JSON forms of a Diagnosis (the JSON keys are issue 6's, plus extra ones)."""

from __future__ import annotations

import json

from umbp_sim.diagnose import Diagnosis

_SAW = {
    "ok": "ok: the request got what it asked for",
    "demoted": "demoted: hugepages were asked for, the buffer is on 4 KiB pages",
    "failed": "failed: the server dies at startup",
    "crashed": "crashed: the process is killed by a signal",
}


def render_text(d: Diagnosis) -> str:
    o = d.run.observed
    saw = _SAW[o.outcome]
    if o.outcome == "ok" and d.run.unbound:
        saw = "ok, but the NUMA binding was dropped"
    lines = [
        f"replay of {d.request.describe()}",
        f"on {d.machine.name} (kernel {d.machine.kernel_version})",
        "",
        "1. what the user saw",
        f"   outcome: {saw}",
    ]
    if o.actual_backing:
        lines.append(f"   actual backing: {o.actual_backing}, mapped {o.mapped_size} bytes")
    if o.error:
        lines.append(f"   error: {o.error}")
    for w in o.warnings:
        lines.append(f"   warning: {w}")
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
    return "\n".join(lines)


def render_json(d: Diagnosis) -> str:
    return json.dumps(d.to_json(), indent=2)
