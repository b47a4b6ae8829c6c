"""Where two runs of one request part: their syscall traces from the first call that differs,
the call site of that call on each side (an external build's: the interposer records it), and
the call that made each mapping or fd a run left held. compare puts it beside the first
differing run of each class of difference (``where``).

Addresses are left out (``0x...``: they differ from process to process, not between
allocators), in the calls compared and in those shown, so a comparison's report is the same
from any process (``--jobs``, ``--shard``). A built-in allocator's calls have no call site:
nothing is said of them. ``locate`` turns the raw sites (object path, offset) into source
lines (``umbp_sim.comparison.call_sites``), in the process that reports.
"""

from __future__ import annotations

import re
from typing import Any

from umbp_sim.comparison.call_sites import locate
from umbp_sim.engine.record import RunRecord

WHERE_CALLS = 6  # calls of each side shown from the first that differs
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")


def _plain_call(line: str) -> str:
    return _ADDRESS.sub("0x...", line)


def _site(r: RunRecord, index: int) -> list[Any] | None:
    """[object, offset] of ``r``'s call at ``index`` of its trace, None if it has none."""
    if not 0 <= index < len(r.trace_sites):
        return None
    site = r.trace_sites[index]
    if not 0 <= site < len(r.call_sites):
        return None
    path, offset = r.call_sites[site]
    return [path, offset]


def _leaks(r: RunRecord) -> list[dict[str, Any]]:
    out = []
    for what, index in r.leaked_by:
        kept = 0 <= index < len(r.trace)
        out.append({
            "what": _plain_call(what),
            "call_number": r.trace_dropped + index + 1 if kept else None,
            "call": _plain_call(r.trace[index]) if kept else None,
            "site": _site(r, index) if kept else None,
        })  # fmt: skip
    return out


def divergence(a: RunRecord, b: RunRecord) -> dict[str, Any] | None:
    """``{"call": the number of the first call that differs (None: none does), "a", "b": each
    side's calls from it (at most WHERE_CALLS), "site_a", "site_b": [object, offset] of that
    call or None, "same_calls": calls compared alike before it, "leaks_a", "leaks_b": (when a
    side left something held) [{"what", "call_number", "call", "site"}]}``; None when neither
    run has a trace nor a leak to say."""
    start = max(a.trace_dropped, b.trace_dropped)  # calls numbered from 1 on both sides
    ia, ib = start - a.trace_dropped, start - b.trace_dropped
    n = start
    while ia < len(a.trace) and ib < len(b.trace):
        if _plain_call(a.trace[ia]) != _plain_call(b.trace[ib]):
            break
        ia, ib, n = ia + 1, ib + 1, n + 1
    parted = ia < len(a.trace) or ib < len(b.trace)
    out: dict[str, Any] = {
        "call": n + 1 if parted else None,
        "same_calls": n - start,
        "a": [_plain_call(c) for c in a.trace[ia : ia + WHERE_CALLS]] if parted else [],
        "b": [_plain_call(c) for c in b.trace[ib : ib + WHERE_CALLS]] if parted else [],
        "site_a": _site(a, ia) if parted else None,
        "site_b": _site(b, ib) if parted else None,
    }
    for side, r in (("a", a), ("b", b)):
        if r.leaked_by:
            out[f"leaks_{side}"] = _leaks(r)
    if not parted and not a.trace and "leaks_a" not in out and "leaks_b" not in out:
        return None
    return out


def located(where: dict[str, Any]) -> dict[str, Any]:
    """``where`` with each raw site ([object, offset]) as its source location
    (``call_sites.locate``: file, line, function, or a note saying why not)."""
    raw = [where.get("site_a"), where.get("site_b")]
    for side in ("a", "b"):
        raw += [leak["site"] for leak in where.get(f"leaks_{side}", ())]
    found = locate((s[0], s[1]) for s in raw if s)

    def loc(site: list[Any] | None) -> dict[str, Any] | None:
        return found[(str(site[0]), int(site[1]))] if site else None

    out = dict(where)
    out["site_a"], out["site_b"] = loc(where.get("site_a")), loc(where.get("site_b"))
    for side in ("a", "b"):
        key = f"leaks_{side}"
        if key in where:
            out[key] = [{**leak, "site": loc(leak["site"])} for leak in where[key]]
    return out


def _at(loc: dict[str, Any] | None) -> list[str]:
    from umbp_sim.comparison.call_sites import site_text

    text = site_text(loc)
    return [f"at {text}"] if text else []


def where_lines(where: dict[str, Any]) -> list[str]:
    """``where`` (located) as lines of text: the calls side by side, call by call, from the
    first that differs, each side's first one with its source line; then each leak's call."""
    lines: list[str] = []
    if where.get("call") is None:
        lines.append(f"the two runs made the same {where.get('same_calls', 0)} calls")
    else:
        first = int(where["call"])
        lines.append(f"where the traces part: call #{first} ({where.get('same_calls', 0)} "
                     "calls alike before it)")  # fmt: skip
        a, b = where.get("a", []), where.get("b", [])
        for i in range(max(len(a), len(b))):
            for side, calls in (("A", a), ("B", b)):
                call = calls[i] if i < len(calls) else "(no more calls)"
                lines.append(f"  {side} #{first + i}: {call}")
                if i == 0:
                    lines += [f"        {t}" for t in _at(where.get(f"site_{side.lower()}"))]
    for side in ("a", "b"):
        for leak in where.get(f"leaks_{side}", ()):
            if leak["call"] is None:
                lines.append(f"{side.upper()} left {leak['what']}: made by a call not kept")
                continue
            lines.append(f"{side.upper()} left {leak['what']}: made by call "
                         f"#{leak['call_number']} {leak['call']}")  # fmt: skip
            lines += [f"        {t}" for t in _at(leak.get("site"))]
    return lines
