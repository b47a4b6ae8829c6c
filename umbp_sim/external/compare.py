"""Compare two allocators' outcomes run by run, differences grouped by class."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from umbp_sim.external.outcome import Outcome, Run
from umbp_sim.external.runner import AllocatorRunner

# The classes of difference, in report order.
CLASSES = (
    "outcome",
    "backing",
    "mapped_size",
    "alignment",
    "numa binding",
    "crash",
    "leak",
    "warning count",
    "warning text",
)


_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")


def _normalized(warnings: list[str]) -> list[str]:
    """Warnings without addresses (they differ from run to run, not between allocators)."""
    return [_ADDRESS.sub("0x...", w) for w in warnings]


def _summary(o: Outcome) -> str:
    if o.result == "crash" and o.crash:
        return f"crash {o.crash['signal']} in {o.crash['stage']}"
    if o.result == "ok" and o.handle:
        return f"ok {o.handle['backing']}"
    if o.result == "timeout":
        return str(o.error)  # "timed out after 60 s in alloc"
    if o.result in ("error", "could-not-run"):
        return f"{o.result}: {o.error}"
    return o.result


def _binding_key(o: Outcome, other: Outcome) -> str | None:
    """What of ``o``'s binding is compared with ``other``'s: the VMA's policy and the nodes its
    hugepages came from ("bind 1; hugepages 2 x 2MiB on node 1"); only the policy when the two
    buffers got different backings (their pages differ for that reason, "backing" says so)."""
    if o.binding is None or not o.handle or not other.handle:
        return o.binding
    if o.handle["backing"] != other.handle["backing"]:
        return o.binding.split(";", 1)[0]
    return o.binding


def differences(a: Outcome, b: Outcome) -> dict[str, tuple[Any, Any]]:
    """{class: (a's value, b's value)} for every class in which the two outcomes differ."""
    out: dict[str, tuple[Any, Any]] = {}
    if a.result != b.result:
        out["outcome"] = (_summary(a), _summary(b))
    ha, hb = a.handle, b.handle
    if a.result == b.result == "ok" and ha and hb:
        for cls, key in (("backing", "backing"), ("mapped_size", "mapped_size")):
            if ha[key] != hb[key]:
                out[cls] = (ha[key], hb[key])
        if ha["alignment"] != hb["alignment"]:
            out["alignment"] = (ha["alignment"], hb["alignment"])
        if _binding_key(a, b) != _binding_key(b, a):
            out["numa binding"] = (a.binding, b.binding)
    if a.result == b.result == "crash" and a.crash and b.crash:
        ca = (a.crash["signal"], a.crash["stage"])
        cb = (b.crash["signal"], b.crash["stage"])
        if ca != cb:
            out["crash"] = (" in ".join(ca), " in ".join(cb))
    if a.leaks != b.leaks:
        out["leak"] = (dict(a.leaks), dict(b.leaks))
    if len(a.warnings) != len(b.warnings):
        out["warning count"] = (len(a.warnings), len(b.warnings))
    elif (wa := _normalized(a.warnings)) != (wb := _normalized(b.warnings)):
        out["warning text"] = (wa, wb)  # addresses as 0x...: the same report from any process
    return out


@dataclass
class Comparison:
    a: str
    b: str
    runs: int = 0
    differing_runs: int = 0
    by_class: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def same(self) -> bool:
        return self.differing_runs == 0

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "runs": self.runs,
            "differing_runs": self.differing_runs,
            "same": self.same,
            "differences": {c: self.by_class[c] for c in CLASSES if c in self.by_class},
        }

    def report(self, examples: int = 5) -> str:
        lines = [f"compared {self.a} (A) with {self.b} (B) over {self.runs} runs"]
        if self.same:
            lines.append("no differences")
            return "\n".join(lines) + "\n"
        lines.append(f"{self.differing_runs} runs differ")
        for cls in CLASSES:
            items = self.by_class.get(cls)
            if not items:
                continue
            lines.append(f"\n{cls}: {len(items)} runs")
            for item in items[:examples]:
                lines.append(f"  {item['run']}")
                lines.append(f"    A: {item['a']}")
                lines.append(f"    B: {item['b']}")
            if len(items) > examples:
                lines.append(f"  ... {len(items) - examples} more (--json for all)")
        return "\n".join(lines) + "\n"


Compared = tuple[Run, dict[str, tuple[Any, Any]], str, str]  # run, differences, outcome lines


def serial_differences(
    a: AllocatorRunner, b: AllocatorRunner, runs: Iterable[Run]
) -> Iterator[Compared]:
    """Each run on ``a`` then on ``b``, in this process (``compare --jobs 1``)."""
    for run in runs:
        yield compared(run, a.run(run), b.run(run))


def compared(run: Run, oa: Outcome, ob: Outcome) -> Compared:
    """What the comparison keeps of one run: its differences and each outcome in one line."""
    return run, differences(oa, ob), _summary(oa), _summary(ob)


def compare_differences(
    a: str,
    b: str,
    items: Iterable[Compared],
    progress: Callable[[int], None] | None = None,
) -> Comparison:
    """The comparison of ``a`` and ``b`` over ``items`` (in run order)."""
    result = Comparison(a, b)
    for i, (run, diff, _la, _lb) in enumerate(items, 1):
        result.runs += 1
        if diff:
            result.differing_runs += 1
            for cls, (va, vb) in diff.items():
                result.by_class.setdefault(cls, []).append({"run": run.label, "a": va, "b": vb})
        if progress:
            progress(i)
    return result


def compare(
    a: AllocatorRunner,
    b: AllocatorRunner,
    runs: Iterable[Run],
    progress: Callable[[int], None] | None = None,
) -> Comparison:
    return compare_differences(str(a.spec), str(b.spec), serial_differences(a, b, runs), progress)
