"""``umbp-sim compare ... --html FILE``: the differences as a self-contained page.

One ``section.diff-class`` per class of difference (in ``CLASSES`` order), headed by the class
and its count of runs, with a ``tr.run`` per differing run: the run (the request and the host
it ran on), each allocator's outcome, and the two values that differ. Every text is escaped:
warning texts and error messages come from the allocators under test.

>>> from umbp_sim.external.compare import Comparison
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

from umbp_sim.external.compare import CLASSES, Comparison
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
        more = ""
        if len(items) > MAX_RUNS_PER_CLASS:
            more = f"<p>... {len(items) - MAX_RUNS_PER_CLASS} more (--json for all)</p>"
        body.append(
            f'<section class="diff-class" data-class="{esc(cls)}">'
            f'<h2>{esc(cls)} <span class="count">{len(items)} runs</span></h2>'
            f'<table class="runs">{head}\n' + "\n".join(rows) + f"</table>{more}</section>"
        )
    return page(f"umbp-sim compare: {result.a} vs {result.b}", "\n".join(body))
