"""``umbp-sim compare ... --html FILE``: the differences as a self-contained page.

One ``section.diff-class`` per class of difference (in ``CLASSES`` order), headed by the class
and its count of runs, with a ``tr.run`` per differing run: the run (the request and the host
it ran on), each allocator's outcome, and the two values that differ; under a class's first
run, a ``tr.where``: the two syscall traces side by side from the first call that differs, that
call's source line on each side, and the call that made each leaked fd or mapping. Every text
is escaped: warning texts and error messages come from the allocators under test.

>>> from umbp_sim.comparison.differences import Comparison
>>> c = Comparison("umbp-sim", "x.so", runs=2, differing_runs=1,
...                by_class={"warning count": [{"run": "r1", "a": 0, "b": 1}]})
>>> page = render_compare_html(c, {"r1": "ok Anonymous"}, {"r1": "ok <Anonymous>"})
>>> page.count('class="diff-class"'), page.count('class="run"'), "&lt;Anonymous&gt;" in page
(1, 1, True)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from umbp_sim.comparison.call_sites import site_text
from umbp_sim.comparison.differences import CLASSES, Comparison
from umbp_sim.html_page import escaped, page

# Runs listed per class (a full matrix can differ in tens of thousands; --json has them all).
MAX_RUNS_PER_CLASS = 2000


def _value(v: Any, texts: list[str] | None = None) -> str:
    if texts is not None:  # a warning count: the count, then each text
        return "\n".join([f"{v} warnings", *texts])
    if isinstance(v, list):
        return "\n".join(str(x) for x in v) or "(none)"
    if isinstance(v, dict):
        return json.dumps(v, sort_keys=True)
    return str(v)


def _where_row(where: dict[str, Any]) -> str:
    """A class's first run's ``where`` (``umbp_sim.comparison.divergence``) as a row: the calls
    side by side (A's column, B's column) from the first that differs, then the leaks."""
    esc = escaped
    pre = ' style="white-space:pre-wrap"'
    parts: list[str] = []
    if where.get("call") is None:
        parts.append(f"<p>the two runs made the same {int(where.get('same_calls', 0))} calls</p>")
    else:
        first = int(where["call"])
        a, b = where.get("a", []), where.get("b", [])
        rows = []
        for i in range(max(len(a), len(b))):
            cells = [f"#{first + i}"]
            for side, calls in (("a", a), ("b", b)):
                text = calls[i] if i < len(calls) else ""
                at = site_text(where.get(f"site_{side}")) if i == 0 else ""
                cells.append(text + (f"\nat {at}" if at else ""))
            rows.append("<tr>" + "".join(f"<td{pre}>{esc(c)}</td>" for c in cells) + "</tr>")
        parts.append(
            f"<p>where the traces part: call #{first}</p>"
            '<table class="calls"><tr><th>call</th><th>A</th><th>B</th></tr>'
            + "".join(rows) + "</table>"
        )  # fmt: skip
    for side in ("a", "b"):
        for leak in where.get(f"leaks_{side}", ()):
            made = (
                f"call #{leak['call_number']} {leak['call']}" if leak["call"] else "a call not kept"
            )
            at = site_text(leak.get("site"))
            text = f"{side.upper()} left {leak['what']}: made by {made}" + (
                f" at {at}" if at else ""
            )
            parts.append(f'<p class="leak">{esc(text)}</p>')
    return f'<tr class="where"><td colspan="5">{"".join(parts)}</td></tr>'


def render_compare_html(
    result: Comparison,
    outcomes_a: Mapping[str, str] | None = None,
    outcomes_b: Mapping[str, str] | None = None,
) -> str:
    """The page of a comparison; ``outcomes_a``/``_b``: each run's outcome line by run label
    (``compare.summary``; a run missing there shows ``-``)."""
    esc = escaped
    outcomes_a = outcomes_a or {}
    outcomes_b = outcomes_b or {}
    verdict = "no differences" if result.same else f"{result.differing_runs} of them differ"
    body = [
        f'<p class="summary">compared {esc(result.a)} (A) with {esc(result.b)} (B) over '
        f"{result.runs} runs: {esc(verdict)}</p>"
    ]
    counts = "".join(
        f"<tr><td>{esc(cls)}</td><td>{len(result.by_class[cls])}</td></tr>"
        for cls in CLASSES
        if result.by_class.get(cls)
    )
    if counts:
        body.append(
            '<table class="classes"><tr><th>class of difference</th><th>runs</th></tr>'
            f"{counts}</table>"
        )
    head = (
        "<tr><th>run (request, host)</th>"
        f"<th>A: {esc(result.a)}</th><th>B: {esc(result.b)}</th>"
        "<th>A's value</th><th>B's value</th></tr>"
    )
    for cls in CLASSES:
        items = result.by_class.get(cls)
        if not items:
            continue
        rows = []
        for item in items[:MAX_RUNS_PER_CLASS]:
            label = str(item["run"])
            cells = (
                label,
                outcomes_a.get(label, "-"),
                outcomes_b.get(label, "-"),
                _value(item["a"], item.get("texts_a")),
                _value(item["b"], item.get("texts_b")),
            )
            tds = "".join(f'<td style="white-space:pre-wrap">{esc(c)}</td>' for c in cells)
            rows.append(f'<tr class="run">{tds}</tr>')
            if "where" in item:
                rows.append(_where_row(item["where"]))
        more = ""
        if len(items) > MAX_RUNS_PER_CLASS:
            more = f"<p>... {len(items) - MAX_RUNS_PER_CLASS} more (--json for all)</p>"
        body.append(
            f'<section class="diff-class" data-class="{esc(cls)}">'
            f'<h2>{esc(cls)} <span class="count">{len(items)} runs</span></h2>'
            f'<table class="runs">{head}\n' + "\n".join(rows) + f"</table>{more}</section>"
        )
    return page(f"umbp-sim compare: {result.a} vs {result.b}", "\n".join(body))
