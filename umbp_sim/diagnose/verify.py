"""``preflight --verify``: the prediction, then the real allocation on this host, side by side.

    v = verify(diagnosis, max_size=1 << 30)   # VerifyError (exit 64) over the cap / not raw
    print(render_verify_text(v)); v.exit_code  # 3 when prediction and reality disagree

The real allocation is an engine ``Measure`` run (``umbp_sim.engine.measure``), in a child
process: the real kernel (``LinuxKernel``), the request's allocator profile (``python -m
umbp_sim.engine.measure``) or its external build (``--allocator PATH|MODULE``: a forked run of the
server the prediction used, its interposer inactive, bounded by ``--run-timeout`` as every
external run), the same size, backing, hugepage size, node and prefault; the child measures the
buffer and frees it. A child killed by a signal is ``crashed``.

Compared, in this order: outcome, backing, node (the node the buffer is bound to, -1 none; and
when bound, every page must be on it), page size, RSS. A request predicted to be OOM-killed is
not performed unless ``force``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from umbp_sim.engine.record import RunTimedOut
from umbp_sim.engine.spec import Measure, Run
from umbp_sim.errors import UmbpSimError
from umbp_sim.vocabulary.backing import HUGETLB_BACKINGS as HUGETLB
from umbp_sim.vocabulary.exit_codes import EX_DISAGREE, EX_USAGE
from umbp_sim.vocabulary.units import format_size

DEFAULT_MAX_SIZE = 1 << 30
FIELDS = ("outcome", "backing", "node", "page_size", "rss")
LABELS = {"page_size": "page size", "rss": "RSS"}
STOPS = ("SIGSTOP", "SIGTSTP", "SIGTTIN", "SIGTTOU")  # a run stopped is ended by umbp-sim


class VerifyError(UmbpSimError):
    exit_code = EX_USAGE


@dataclass
class Side:
    """What one side (prediction or reality) says about the buffer."""

    outcome: str
    backing: str | None = None
    node: int | None = None  # bound node, -1 none; None: no buffer
    page_size: int | None = None
    rss: int | None = None
    pages_on: dict[int, int] = field(default_factory=dict)  # node -> pages (reality only)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "actual_backing": self.backing,
            "node": self.node,
            "page_size": self.page_size,
            "rss": self.rss,
            "pages_on_nodes": {str(k): v for k, v in sorted(self.pages_on.items())},
            "error": self.error,
        }


@dataclass
class Verification:
    request: str
    allocator: str
    predicted: Side
    real: Side
    prediction_exit: int

    @property
    def disagreement(self) -> str | None:
        """The first field where prediction and reality differ, else None."""
        p, r = self.predicted, self.real
        for name in FIELDS:
            if getattr(p, name) != getattr(r, name):
                return name
        if p.node is not None and p.node >= 0 and set(r.pages_on) - {p.node}:
            return "node"
        return None

    @property
    def exit_code(self) -> int:
        return EX_DISAGREE if self.disagreement else self.prediction_exit

    def to_json(self) -> dict[str, Any]:
        return {
            "request": self.request,
            "allocator": self.allocator,
            "predicted": self.predicted.to_json(),
            "real": self.real.to_json(),
            "agree": self.disagreement is None,
            "first_disagreement": self.disagreement,
        }


def predicted_side(d: Any) -> Side:
    """The prediction from a Diagnosis (``umbp_sim.diagnose.Diagnosis``)."""
    o = d.run.observed
    backing, hp, _node, prefault = d.request.settings()
    if o.outcome in ("failed", "crashed"):
        return Side(o.outcome, error=o.error)
    page = hp if o.actual_backing in HUGETLB else d.machine.page_size
    rss = o.mapped_size if prefault else 0
    return Side(o.outcome, o.actual_backing, o.bound_node, page, rss)


def is_oom_kill(d: Any) -> bool:
    o = d.run.observed
    return o.outcome == "crashed" and o.signal == "SIGKILL"


def check_request(request: Any, max_size: int) -> None:
    """VerifyError for a request --verify will not perform (not raw, above the cap)."""
    if request.kind != "raw":
        raise VerifyError("--verify: performs raw requests only (--size ...), not sglang's pool")
    if request.raw.size > max_size:
        raise VerifyError(
            f"--verify: {format_size(request.raw.size)} is above the cap of "
            f"{format_size(max_size)} (--verify-max-size to raise it)"
        )


def perform(d: Any) -> Side:
    """The real allocation (an engine ``Measure`` run): an external build's in a run of its
    server (as its other runs: bounded by ``--run-timeout``, its own process group),
    umbp-sim's in ``python -m umbp_sim.engine.measure``."""
    from umbp_sim import run_router  # above the engine: on the first run, not at import

    allocator = d.request.allocator
    req = d.request.alloc_request()
    rec = run_router.run(Run(d.machine, Measure(req), allocator=allocator))
    if rec.outcome == "timeout":
        raise RunTimedOut(f"--allocator {allocator}: a run {rec.error} (--run-timeout)")
    if rec.outcome == "could-not-run":
        raise UmbpSimError(f"--verify: the child process failed: {rec.error}")
    if rec.outcome == "crashed":
        how = "stopped" if rec.signal in STOPS else "killed"
        during = f" during {rec.stage}" if rec.stage else ""
        return Side("crashed", error=f"the child process was {how} by {rec.signal}{during}")
    return Side(
        rec.outcome, rec.actual_backing, rec.bound_node, rec.page_size, rec.rss,
        dict(rec.pages_on), rec.error,
    )  # fmt: skip


def refusal(d: Any) -> str:
    return (
        f"--verify: the prediction is an OOM kill ({d.run.observed.error}); not performed "
        "(--force to perform it anyway)"
    )


def verify(d: Any, max_size: int = DEFAULT_MAX_SIZE, force: bool = False) -> Verification:
    check_request(d.request, max_size)
    if is_oom_kill(d) and not force:
        raise VerifyError(refusal(d))
    real = perform(d)
    return Verification(
        d.request.describe(), d.request.allocator, predicted_side(d), real, d.exit_code
    )


def _size(v: int | None) -> str:
    return "-" if v is None else format_size(v)


def render_verify_text(v: Verification) -> str:
    p, r = v.predicted, v.real

    def node(s: Side) -> str:
        if s.node is None:
            return "-"
        text = "none" if s.node < 0 else str(s.node)
        if s.pages_on:
            text += " (pages on " + ", ".join(f"N{k}" for k in sorted(s.pages_on)) + ")"
        return text

    rows = [
        ("", "predicted", "real (this host)"),
        ("outcome", p.outcome, r.outcome),
        ("backing", p.backing or "-", r.backing or "-"),
        ("node", node(p), node(r)),
        ("page size", _size(p.page_size), _size(r.page_size)),
        ("RSS", _size(p.rss), _size(r.rss)),
    ]
    w0 = max(len(a) for a, _, _ in rows)
    w1 = max(len(b) for _, b, _ in rows)
    out = [f"verify: {v.request}, allocator {v.allocator}, in a child process (freed)"]
    out += [f"  {a.ljust(w0)}  {b.ljust(w1)}  {c}".rstrip() for a, b, c in rows]
    if r.error and r.outcome != p.outcome:
        out.append(f"  real error: {r.error}")
    what = v.disagreement
    if what is None:
        out.append("prediction and reality agree")
    else:
        label = LABELS.get(what, what)
        out.append(f"first disagreement: {label} (exit {EX_DISAGREE})")
    return "\n".join(out)
