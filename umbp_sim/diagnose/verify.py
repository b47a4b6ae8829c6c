"""``preflight --verify``: the prediction, then the real allocation on this host, side by side.

    v = verify(diagnosis, max_size=1 << 30)   # VerifyError (exit 64) over the cap / not raw
    print(render_verify_text(v)); v.exit_code  # 3 when prediction and reality disagree

The real allocation runs in a child process: the real kernel (``LinuxKernel``), the request's
allocator profile (``python -m umbp_sim.diagnose.verify``, printing JSON) or its external build
(``--allocator PATH|MODULE``: a forked run of the server the prediction used, its interposer
inactive, bounded by ``--run-timeout`` as every external run: ``umbp_sim.external.procs``; its
bound node read from numa_maps), the same size, backing, hugepage size, node and prefault; the
child measures the buffer (page size: smaps' KernelPageSize; RSS: its resident bytes by
mincore(2); nodes: the numa_maps entry holding it) and frees it. A child killed by a signal is
``crashed``.

Compared, in this order: outcome, backing, node (the node the buffer is bound to, -1 none; and
when bound, every page must be on it), page size, RSS. A request predicted to be OOM-killed is
not performed unless ``force``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from umbp_sim.backing import HUGETLB_BACKINGS as HUGETLB, alloc_outcome
from umbp_sim.errors import UmbpSimError
from umbp_sim.units import format_size

EX_USAGE = 64
EX_DISAGREE = 3
DEFAULT_MAX_SIZE = 1 << 30
FIELDS = ("outcome", "backing", "node", "page_size", "rss")
LABELS = {"page_size": "page size", "rss": "RSS"}


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


def perform(d: Any, timeout: float = 300.0) -> Side:
    """The real allocation in a child process: an external build's in a run of its server (as
    its other runs: bounded by ``--run-timeout``, its own process group), umbp-sim's in
    ``python -m umbp_sim.diagnose.verify``."""
    backing, hp, node, prefault = d.request.settings()
    spec = {
        "size": d.request.raw.size,
        "backing": backing,
        "hugepage_size": hp,
        "numa_node": node,
        "prefault": prefault,
        "allocator": d.request.allocator,
    }
    from umbp_sim.allocator_spec import is_external

    if is_external(spec["allocator"]):
        return _side(_perform_external(d, spec))
    # cwd "/": `-m` must import the installed package, not a source tree's (no _native there).
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "umbp_sim.diagnose.verify", json.dumps(spec)],
            capture_output=True,
            text=True,
            cwd="/",
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise UmbpSimError(f"--verify: the child process took over {timeout:.0f} s") from None
    if proc.returncode < 0:
        sig = signal.Signals(-proc.returncode).name
        return Side("crashed", error=f"the child process was killed by {sig}")
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UmbpSimError(f"--verify: the child process exited {proc.returncode}: {last}")
    return _side(json.loads(proc.stdout))


def _perform_external(d: Any, spec: dict[str, Any]) -> dict[str, Any] | Side:
    """``spec`` on the external build, in a forked run of the server the prediction used
    (``external.observe.runner_for``; its interposer inactive: the real kernel)."""
    from umbp_sim.allocator_spec import parse_allocator_spec
    from umbp_sim.external.observe import ObserveJob, runner_for
    from umbp_sim.external.runner import RunTimedOut, timed_out_text

    allocator = spec["allocator"]
    runner = runner_for(parse_allocator_spec(allocator))
    reply = runner.observe(ObserveJob(machine=d.machine, kind="verify", request=spec))
    if reply.get("timed_out") is not None:
        raise RunTimedOut(f"--allocator {allocator}: a run {timed_out_text(reply)} (--run-timeout)")
    stage = reply["stages"][-1] if reply["stages"] else "start"
    if reply.get("stopped") is not None:
        return Side("crashed", error=f"the child process was stopped by {reply['stopped']} "
                    f"during {stage} (umbp-sim ended it)")  # fmt: skip
    if reply["signal"] is not None:
        sig = signal.Signals(reply["signal"]).name
        return Side("crashed", error=f"the child process was killed by {sig} during {stage}")
    if reply["result"] is None:
        log = reply["log"].strip()
        last = log.splitlines()[-1] if log else "no output"
        raise UmbpSimError(f"--verify: the child process exited {reply['code']}: {last}")
    result: dict[str, Any] = reply["result"]["observed"]
    return result


def _side(r: dict[str, Any] | Side) -> Side:
    if isinstance(r, Side):
        return r
    return Side(
        r["outcome"],
        r["backing"],
        r["node"],
        r["page_size"],
        r["rss"],
        {int(k): v for k, v in r["pages_on"].items()},
        r["error"],
    )


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


# ---- the child ---------------------------------------------------------------------------------


def _smaps_entry(addr: int) -> dict[str, int]:
    """The smaps fields (kB) of the mapping that holds ``addr``."""
    fields: dict[str, int] = {}
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(maxsplit=1)[0]
            if "-" in head and ":" not in head:
                if inside:
                    break
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head.endswith(":"):
                parts = line.split()
                if len(parts) >= 2 and parts[1].isdigit():
                    fields[head[:-1]] = int(parts[1])
    return fields


def _resident(addr: int, length: int) -> int:
    """Bytes of [addr, addr+length) in memory (mincore(2)): smaps' Rss would count a
    neighbouring mapping the kernel merged with the buffer's."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    page = os.sysconf("SC_PAGE_SIZE")
    n = (length + page - 1) // page
    vec = (ctypes.c_ubyte * n)()
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    if libc.mincore(addr, length, vec) != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(b & 1 for b in bytes(vec)) * page


def _pages_on(addr: int) -> dict[int, int]:
    """{node: pages} of the numa_maps entry that holds ``addr`` (the last one starting below)."""
    best: tuple[int, list[str]] | None = None
    with open("/proc/self/numa_maps") as f:
        for line in f:
            tok = line.split()
            start = int(tok[0], 16) if tok else addr + 1
            if start <= addr and (best is None or start > best[0]):
                best = (start, tok)
    out: dict[int, int] = {}
    for t in best[1][2:] if best else []:
        key, eq, value = t.partition("=")
        if eq and key[:1] == "N" and key[1:].isdigit() and value.isdigit():
            out[int(key[1:])] = int(value)
    return out


def _bound_node(addr: int) -> int:
    """The node of the numa_maps entry holding ``addr`` when its policy binds to one, else -1."""
    best: tuple[int, list[str]] | None = None
    with open("/proc/self/numa_maps") as f:
        for line in f:
            tok = line.split()
            start = int(tok[0], 16) if tok else addr + 1
            if start <= addr and (best is None or start > best[0]):
                best = (start, tok)
    policy = best[1][1] if best and len(best[1]) > 1 else ""
    nodes = policy.removeprefix("bind:")
    return int(nodes) if policy.startswith("bind:") and nodes.isdigit() else -1


def _allocator(name: str) -> tuple[Any, Any, bool]:
    """(allocator, its backing enum, external?) for a profile or an external SPEC."""
    from umbp_sim.allocator_spec import is_external, parse_allocator_spec

    if is_external(name):
        from umbp_sim.external.child import load_allocator

        spec = parse_allocator_spec(name)
        module = load_allocator({"kind": spec.kind, "name": spec.name, "path": spec.path or ""})
        return module.UMBPHostMemAllocator(), module.UMBPHostBufferBacking, True
    import umbp_sim._native as _native
    from umbp_sim.allocator import UMBPHostBufferBacking, UMBPHostMemAllocator

    allocator = UMBPHostMemAllocator(kernel=_native.LinuxKernel(), profile=name)
    return allocator, UMBPHostBufferBacking, False


def child_main(
    spec: dict[str, Any], module: Any = None, report: Any = lambda stage: None
) -> dict[str, Any]:
    """The real allocation, measured and freed. ``module``: an external build already loaded
    (in a run of its server, the interposer inactive), with ``report`` for its stages."""
    if module is not None:
        allocator, backings = module.UMBPHostMemAllocator(), module.UMBPHostBufferBacking
        external = True
    else:
        allocator, backings, external = _allocator(spec["allocator"])
    report("alloc")
    h = allocator.alloc(
        spec["size"],
        getattr(backings, spec["backing"]),
        spec["hugepage_size"],
        spec["numa_node"],
        spec["prefault"],
    )
    if not h:
        return {
            "outcome": "failed",
            "backing": None,
            "node": None,
            "page_size": None,
            "rss": None,
            "pages_on": {},
            "error": f"RuntimeError: UMBPHostMemAllocator.alloc({spec['size']} bytes) failed "
            f"(requested_backing=UMBPHostBufferBacking.{spec['backing']}, "
            f"numa_node={spec['numa_node']}).",
        }
    report("measure")
    try:
        sm = _smaps_entry(h.ptr)
        pages = _pages_on(h.ptr)
        got = str(getattr(h.actual_backing, "name", h.actual_backing)).rsplit(".", 1)[-1]
        rss = _resident(h.ptr, h.mapped_size)
        return {
            "outcome": alloc_outcome(spec["backing"], got),
            "backing": got,
            "node": _bound_node(h.ptr) if external else h.numa_node,
            "page_size": sm.get("KernelPageSize", 0) * 1024 or None,
            "rss": rss,
            "pages_on": {str(k): v for k, v in pages.items() if v},
            "error": None,
        }
    finally:
        report("free")
        allocator.free(h)


if __name__ == "__main__":
    print(json.dumps(child_main(json.loads(sys.argv[1]))))
