"""Compare two allocators' records run by run, differences grouped by class.

Each run (an engine ``Run`` with an ``Alloc`` that writes the first byte and frees) goes to both
allocators; their ``RunRecord``s are compared class by class. compare says a record in its own
words (:func:`result`): a valid buffer is "ok" whatever its backing (a different backing is the
class "backing"), a null handle "invalid", an exception "error" (out of alloc, or out of free:
"error: free: ..."), a death "crash"; "timeout" and "could-not-run" as the record says.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from umbp_sim.comparison.divergence import divergence, located, where_lines
from umbp_sim.comparison.fault_reuse import FaultFreeTwin
from umbp_sim.engine.record import RunRecord
from umbp_sim.engine.spec import Run
from umbp_sim.external.runner import CouldNotRun, seconds
from umbp_sim.run_router import OpenedAllocator
from umbp_sim.vocabulary.bounded import shown
from umbp_sim.vocabulary.printable import printable

# The classes of difference, in report order.
CLASSES = (
    "outcome",
    "backing",
    "requested_size",
    "mapped_size",
    "alignment",
    "handle",
    "numa binding",
    "faulted",
    "mapping",
    "crash",
    "leak",
    "after free",
    "registry",
    "steps",
    "warning count",
    "warning text",
    "log level",
)


_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")


def _normalized(warnings: list[str]) -> list[str]:
    """Warnings without addresses (they differ from run to run, not between allocators)."""
    return [_ADDRESS.sub("0x...", w) for w in warnings]


_WORDS = {"ok": "ok", "demoted": "ok", "crashed": "crash"}


def result(r: RunRecord) -> str:
    """compare's word for a record's outcome: ok, invalid, error, crash, timeout, could-not-run."""
    if r.outcome == "failed":
        return "invalid" if r.failure == "invalid" else "error"
    return _WORDS.get(r.outcome, r.outcome)


def summary(r: RunRecord) -> str:
    """A record in one line: ``ok AnonymousHugetlb``, ``crash SIGBUS in alloc``, ..."""
    word = result(r)
    if word == "crash":
        return f"crash {r.signal} in {r.stage}"
    if word == "ok" and r.handle:
        return f"ok {r.handle['backing']}"
    if word == "timeout":
        return str(r.error)  # "timed out after 60 s in alloc"
    if word in ("error", "could-not-run"):
        return f"{word}: {r.error}"
    return word


def _binding_key(o: RunRecord, other: RunRecord) -> str | None:
    """What of ``o``'s binding is compared with ``other``'s: the VMA's policy and the nodes its
    hugepages came from ("bind 1; hugepages 2 x 2MiB on node 1"); only the policy when the two
    buffers got different backings (their pages differ for that reason, "backing" says so)."""
    if o.binding is None or not o.handle or not other.handle:
        return o.binding
    if o.handle["backing"] != other.handle["backing"]:
        return o.binding.split(";", 1)[0]
    return o.binding


# The handle's fields that have a class of their own (a valid buffer's, compared as such): the
# class "handle" holds the others.
OWN_CLASS = ("requested_size", "mapped_size", "actual_backing", "actual_alignment")


def field_differences(
    a: dict[str, Any] | None, b: dict[str, Any] | None, skip: tuple[str, ...] = ()
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The fields of two handle records (``engine.record.handle_record``) that differ, each
    side's ``{field: value}`` in ``a``'s order; a field one build's handle does not have is not
    compared. None: none differ (or a side has no record)."""
    if a is None or b is None:
        return None
    keys = [k for k in a if k in b and k not in skip and a[k] != b[k]]
    if not keys:
        return None
    return {k: a[k] for k in keys}, {k: b[k] for k in keys}


def differences(a: RunRecord, b: RunRecord) -> dict[str, tuple[Any, Any]]:
    """{class: (a's value, b's value)} for every class in which the two records differ."""
    out: dict[str, tuple[Any, Any]] = {}
    ra, rb = result(a), result(b)
    if ra != rb:
        out["outcome"] = (summary(a), summary(b))
    ha, hb = a.handle, b.handle
    if ra == rb == "ok" and ha and hb:
        for key in ("backing", "requested_size", "mapped_size"):
            if ha[key] != hb[key]:
                out[key] = (ha[key], hb[key])
        if ha["alignment"] != hb["alignment"]:
            out["alignment"] = (ha["alignment"], hb["alignment"])
        if _binding_key(a, b) != _binding_key(b, a):
            out["numa binding"] = (a.binding, b.binding)
        if a.faulted != b.faulted and ha["backing"] == hb["backing"]:
            out["faulted"] = (a.faulted, b.faulted)
        if a.mapping != b.mapping and ha["backing"] == hb["backing"]:
            out["mapping"] = (a.mapping, b.mapping)
    if ra == rb:  # everything else the handle alloc returned carries (an invalid one too)
        fields = field_differences(
            a.handle_after_alloc, b.handle_after_alloc, OWN_CLASS if ra == "ok" else ()
        )
        if fields is not None:
            out["handle"] = fields
    if ra == rb == "crash":
        ca, cb = (str(a.signal), str(a.stage)), (str(b.signal), str(b.stage))
        if ca != cb:
            out["crash"] = (" in ".join(ca), " in ".join(cb))
    if a.held != b.held:
        out["leak"] = (dict(a.held), dict(b.held))
    # Every field as the first Free left the handle, but one that differed already in what
    # alloc returned (a backing both builds keep: its own class says so).
    before = field_differences(a.handle_after_alloc, b.handle_after_alloc)
    freed = field_differences(a.after_free, b.after_free, tuple(before[0]) if before else ())
    if ra == rb and freed is not None:
        out["after free"] = freed
    # Asked only where both builds have the registry, of the same backing (a demoted buffer is
    # no memfd: "backing" says why it is not registered) and to the same end (a free that
    # crashed or raised leaves no after-free answer: "outcome" says so).
    same_backing = bool(ha and hb and ha["backing"] == hb["backing"])
    asked = ra == rb and same_backing and None not in (a.registry, b.registry)
    if asked and a.registry != b.registry:
        out["registry"] = (a.registry, b.registry)
    if a.steps != b.steps:  # a steps scenario's: what each step came to (the shm registry's)
        out["steps"] = (a.steps, b.steps)
    # The allocators' own lines, addresses as 0x... (the same report from any process); a
    # count that differs is said with the texts of both sides.
    na, nb = _normalized(a.allocator_warnings), _normalized(b.allocator_warnings)
    if len(na) != len(nb):
        out["warning count"] = (na, nb)
    elif na != nb:
        out["warning text"] = (na, nb)
    elif (la := _levels(a)) != (lb := _levels(b)):  # the same lines, said at other levels
        out["log level"] = (
            [f"[{lv}] {t}" for lv, t in zip(la, na, strict=True)],
            [f"[{lv}] {t}" for lv, t in zip(lb, nb, strict=True)],
        )
    return out


def _levels(r: RunRecord) -> list[str]:
    """The level of each allocator line (a record that kept none: "warning", each)."""
    n = len(r.allocator_warnings)
    return r.allocator_levels if len(r.allocator_levels) == n else ["warning"] * n


@dataclass
class Comparison:
    a: str
    b: str
    runs: int = 0
    differing_runs: int = 0
    by_class: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # A shard's (compare --shard K/N): {"k", "n", "total", "digest"} of the whole run list, and
    # each differing run's place in it, so that --merge rebuilds the whole comparison.
    shard: dict[str, Any] | None = None
    index: dict[str, int] = field(default_factory=dict)

    @property
    def same(self) -> bool:
        return self.differing_runs == 0

    def to_json(self) -> dict[str, Any]:
        differences = {c: self.by_class[c] for c in CLASSES if c in self.by_class}
        out = {
            "a": self.a,
            "b": self.b,
            "runs": self.runs,
            "differing_runs": self.differing_runs,
            "same": self.same,
            "differences": differences,
        }
        if self.shard is not None:
            out["shard"] = self.shard
            out["differences"] = {
                c: [{**item, "index": self.index[item["run"]]} for item in items]
                for c, items in differences.items()
            }
        return out

    def report(self, examples: int = 5) -> str:
        a, b = printable(self.a), printable(self.b)
        lines = [f"compared {a} (A) with {b} (B) over {self.runs} runs"]
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
                lines.append(f"  {_echoed(item['run'])}")
                for side in ("a", "b"):
                    lines.append(f"    {side.upper()}: {_echoed(item[side])}")
                    texts = item.get(f"texts_{side}", ())
                    lines += [f"       {_echoed(t)}" for t in texts[:MAX_TEXTS_SHOWN]]
                    if len(texts) > MAX_TEXTS_SHOWN:
                        more = len(texts) - MAX_TEXTS_SHOWN
                        lines.append(f"       ... {more:,} more (--json for all)")
                if "where" in item:
                    lines += [f"    {_echoed(t)}" for t in where_lines(item["where"])]
            if len(items) > examples:
                lines.append(f"  ... {len(items) - examples} more (--json for all)")
        return "\n".join(lines) + "\n"


# A value the text report echoes: a label, an outcome line, a warning text, as it is up to this
# many characters (a longer one, an allocator's runaway line or a merged shard's, bounded by
# ``shown``), control characters escaped; at most this many texts of a warning count.
MAX_ECHOED = 2000
MAX_TEXTS_SHOWN = 50


def _echoed(value: Any) -> str:
    text = str(value)
    return printable(text if len(text) <= MAX_ECHOED else shown(value))


# run, differences, each record in one line, the stage each side's run timed out in (None: it
# did not time out), and where the two runs part (``divergence``: a differing run's, else None).
Compared = tuple[
    Run, dict[str, tuple[Any, Any]], str, str, tuple[str | None, str | None], dict[str, Any] | None
]

# Runs in a row that timed out in one stage on one allocator: compare stops there (an allocator
# that hangs in every alloc would cost --run-timeout per run), unless --keep-going.
STALLED_RUNS = 3


class Stalled(CouldNotRun):
    """``STALLED_RUNS`` runs in a row of one allocator timed out in the same stage."""


def serial_differences(
    a: OpenedAllocator, b: OpenedAllocator, runs: Iterable[Run]
) -> Iterator[Compared]:
    """Each run on ``a`` then on ``b``, in this process (``compare --jobs 1``); a faulted run
    whose faults cannot fire takes its fault-free twin's comparison (``fault_reuse``)."""
    twin = FaultFreeTwin()
    for run in runs:
        yield compare_run(run, a, b, twin)


def compare_run(run: Run, a: OpenedAllocator, b: OpenedAllocator, twin: FaultFreeTwin) -> Compared:
    """``run`` on ``a`` then ``b`` and compared, or its fault-free twin's comparison."""
    reused = twin.reuse(run)
    if reused is not None:
        return (run, *reused)  # type: ignore[return-value]
    ra, rb = a.run(run), b.run(run)
    item = compared(run, ra, rb)
    twin.ran(run, ra, rb, item[1:])
    return item


def compared(run: Run, oa: RunRecord, ob: RunRecord) -> Compared:
    """What the comparison keeps of one run: its differences, each record in one line, and
    where the two runs part (a differing run's)."""
    diff = differences(oa, ob)
    where = divergence(oa, ob) if diff else None
    return run, diff, summary(oa), summary(ob), (_timed_out(oa), _timed_out(ob)), where


def _timed_out(r: RunRecord) -> str | None:
    """The stage a run that timed out was in; None for any other outcome."""
    return str(r.stage) if r.outcome == "timeout" else None


def stop_when_stalled(
    items: Iterator[Compared], names: tuple[str, str], total: int, run_timeout: float
) -> Iterator[Compared]:
    """``items`` until ``STALLED_RUNS`` runs in a row of one allocator (``names``: A's, B's) timed
    out in the same stage: then ``Stalled``, in one line. ``items`` is closed either way (its
    workers end)."""
    streak: list[tuple[str | None, int]] = [(None, 0), (None, 0)]
    done = 0
    try:
        for item in items:
            done += 1
            for side, stage in enumerate(item[4]):
                last, count = streak[side]
                streak[side] = (stage, count + 1 if stage is not None and stage == last else 1)
                if stage is not None and streak[side][1] >= STALLED_RUNS:
                    raise Stalled(
                        f"{names[side]}: {STALLED_RUNS} runs in a row timed out after "
                        f"{seconds(run_timeout)} in {stage}; stopped after {done} of {total} "
                        "runs (--keep-going runs them all)"
                    )
            yield item
    finally:
        items.close()  # type: ignore[attr-defined]


def _item(label: str, cls: str, va: Any, vb: Any) -> dict[str, Any]:
    """One differing run of a class: its values; a warning count's texts beside the counts."""
    if cls == "warning count":
        return {"run": label, "a": len(va), "b": len(vb), "texts_a": va, "texts_b": vb}
    return {"run": label, "a": va, "b": vb}


def compare_differences(
    a: str,
    b: str,
    items: Iterable[Compared],
    progress: Callable[[int], None] | None = None,
) -> Comparison:
    """The comparison of ``a`` and ``b`` over ``items`` (in run order)."""
    result = Comparison(a, b)
    for i, (run, diff, *_rest, where) in enumerate(items, 1):
        result.runs += 1
        if diff:
            result.differing_runs += 1
            for cls, (va, vb) in diff.items():
                item = _item(run.label, cls, va, vb)
                first = cls not in result.by_class
                if first and where is not None:  # a class's first run says where
                    item["where"] = located(where)
                result.by_class.setdefault(cls, []).append(item)
        if progress:
            progress(i)
    return result


def compare(
    a: OpenedAllocator,
    b: OpenedAllocator,
    runs: Iterable[Run],
    progress: Callable[[int], None] | None = None,
) -> Comparison:
    return compare_differences(str(a.spec), str(b.spec), serial_differences(a, b, runs), progress)
