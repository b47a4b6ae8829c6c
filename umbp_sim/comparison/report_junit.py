"""``umbp-sim compare ... --junit FILE``: a comparison as JUnit XML, for CI dashboards.

One ``testcase`` per class of difference (``CLASSES``, in order): it passes when no run differs
in that class, else it fails with the count of runs in its ``message`` and every differing run
(its label names the request, the host and the fault) with both values in its text, the first
run with where the two runs part (``umbp_sim.comparison.divergence.where_lines``). The suite
counts the runs compared in a ``property``.

>>> from umbp_sim.comparison.differences import Comparison
>>> c = Comparison("umbp-sim", "x.so", runs=2, differing_runs=1,
...                by_class={"crash": [{"run": "r1", "a": "SIGBUS in alloc", "b": "-"}]})
>>> xml = render_junit(c)
>>> xml.count("<testcase "), xml.count("<failure "), 'failures="1"' in xml
(9, 1, True)
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from umbp_sim.comparison.differences import CLASSES, Comparison
from umbp_sim.comparison.divergence import where_lines
from umbp_sim.vocabulary.printable import markup

# Runs listed in one failure's text (a full matrix can differ in thousands; --json has all).
MAX_RUNS_PER_CASE = 200


# Every text an allocator or a shard gave goes through ``markup``: a control character (an
# allocator's warning may hold one) would make XML that does not parse.


def _side(item: dict[str, Any], side: str) -> list[str]:
    lines = [f"  {side.upper()}: {item[side]}"]
    return lines + [f"     {t}" for t in item.get(f"texts_{side}", ())]


def render_junit(result: Comparison) -> str:
    """The comparison as one JUnit ``testsuite`` (a ``testsuites`` document)."""
    failing = [cls for cls in CLASSES if result.by_class.get(cls)]
    root = ET.Element("testsuites")
    suite = ET.SubElement(
        root,
        "testsuite",
        name=markup(f"umbp-sim compare {result.a} {result.b}"),
        tests=str(len(CLASSES)),
        failures=str(len(failing)),
        errors="0",
    )
    props = ET.SubElement(suite, "properties")
    ET.SubElement(props, "property", name="runs", value=str(result.runs))
    ET.SubElement(props, "property", name="differing_runs", value=str(result.differing_runs))
    for cls in CLASSES:
        case = ET.SubElement(suite, "testcase", classname="umbp-sim.compare", name=cls)
        items = result.by_class.get(cls)
        if not items:
            continue
        failure = ET.SubElement(
            case, "failure", message=f"{len(items)} of {result.runs} runs differ in {cls}"
        )
        lines: list[str] = []
        for item in items[:MAX_RUNS_PER_CASE]:
            lines += [str(item["run"]), *_side(item, "a"), *_side(item, "b")]
            if "where" in item:
                lines += [f"  {t}" for t in where_lines(item["where"])]
        if len(items) > MAX_RUNS_PER_CASE:
            lines.append(f"... {len(items) - MAX_RUNS_PER_CASE} more (--json for all)")
        failure.text = markup("\n".join(lines))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
