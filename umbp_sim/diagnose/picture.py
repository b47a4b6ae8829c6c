"""Each node's memory and hugepage pools against what a request needs, as bars.

Plain data in, text out: :func:`picture` takes a ``Machine``, the request's buffer sizes and
settings and the outcome, and returns a :class:`Picture` (numbers only); :func:`render_bars`
draws it as one terminal bar per node, ``umbp_sim.diagnose.html_report.render_html`` as an HTML
page. Nothing here runs the allocator or reads a dump; each node's free memory is the one SimKernel
starts with (``umbp_sim.sim.start_numbers``).

A node's bar is its MemTotal, split into (left to right) the free and the used pages of the
requested hugepage size, the pools of other sizes, the memory in use and the free memory
outside the pools. The request's bar, on the same scale, is what it needs: hugepages of the
requested size (rounded up per buffer) or plain memory. A ``|`` on the bar of the node the
request is bound to marks where the need ends when counted from that node's free pages.

>>> from umbp_sim.machine import Machine
>>> m = Machine.x86_64(nodes=2, mem_per_node="8GiB", hugepages_per_node=[{"2MiB": 1024}, {}])
>>> pic = picture(m, [1 << 30], "AnonymousHugetlb", 2 << 20, 1, "demoted")
>>> print(describe_request(pic))
request: 1.0 GiB of 2 MiB hugepages (AnonymousHugetlb) on node 1 -> demoted
>>> for line in render_bars(pic, width=20).splitlines()[1:4]:
...     print(line.split("]")[0] + "]")
  node 0  [#####...............]
  node 1* [.|..................]
  request [##                  ]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from umbp_sim.machine import Machine
from umbp_sim.sim import start_numbers
from umbp_sim.vocabulary.backing import HUGETLB_BACKINGS

if TYPE_CHECKING:
    from umbp_sim.diagnose import Diagnosis


# Segment kinds, left to right on a node's bar: (kind, terminal character, legend text).
SEGMENTS: tuple[tuple[str, str, str], ...] = (
    ("pool_free", "#", "free {size} pages"),
    ("pool_used", "=", "used {size} pages"),
    ("other_pools", "%", "other pools"),
    ("mem_used", ":", "memory in use"),
    ("mem_free", ".", "free memory"),
)


@dataclass(frozen=True)
class Segment:
    """A run of one kind on a bar, in bytes."""

    kind: str
    nbytes: int


@dataclass(frozen=True)
class NodeBar:
    """One node: its memory split into segments, and how the request's need compares."""

    node: int
    mem_total: int
    mem_free: int
    pool_total: int  # bytes of the requested hugepage size's pool on this node
    pool_free: int
    segments: tuple[Segment, ...]
    target: bool  # the request is bound to this node
    short: int  # bytes the request lacks on this node (target only; 0 if it fits)


@dataclass(frozen=True)
class Picture:
    """Numbers for the bars: the host's nodes, and the request on the same scale."""

    host: str
    backing: str
    hugetlb: bool
    hugepage_size: int
    numa_node: int
    needed: int  # bytes the request needs (hugetlb: whole pages per buffer)
    outcome: str
    nodes: tuple[NodeBar, ...]

    @property
    def scale(self) -> int:
        """Bytes of a full bar: the largest node (its memory, or its segments when a dump
        claims pools larger than the node), or the request if it is larger."""
        nodes = (max(n.mem_total, sum(s.nbytes for s in n.segments)) for n in self.nodes)
        return max([self.needed, 1, *nodes])


def needed_bytes(sizes: Sequence[int], hugetlb: bool, hugepage_size: int) -> int:
    """What the buffers take: each rounded up to whole hugepages for a hugetlb backing."""
    if not hugetlb or hugepage_size <= 0:
        return sum(sizes)
    return sum(-(-s // hugepage_size) * hugepage_size for s in sizes)


def picture(
    machine: Machine,
    sizes: Sequence[int],
    backing: str,
    hugepage_size: int,
    numa_node: int,
    outcome: str,
) -> Picture:
    """The bars' numbers for a request of ``sizes`` (bytes per buffer) on ``machine``."""
    hugetlb = backing in HUGETLB_BACKINGS
    needed = needed_bytes(sizes, hugetlb, hugepage_size)
    start = start_numbers(machine)  # each node's MemFree as SimKernel starts with it
    nodes = []
    for node in machine.nodes:
        pool_bytes = sum(size * p.total for size, p in node.hugepages.items())
        pool = node.hugepages.get(hugepage_size)
        pool_total = pool.total * hugepage_size if pool else 0
        pool_free = (pool.total if pool.free is None else pool.free) * hugepage_size if pool else 0
        # on the bar: what is free, within the memory outside the pools
        mem_free = max(0, min(start.node(node.id).mem_free, node.mem_total - pool_bytes))
        segments = (
            Segment("pool_free", pool_free),
            Segment("pool_used", pool_total - pool_free),
            Segment("other_pools", pool_bytes - pool_total),
            Segment("mem_used", max(0, node.mem_total - pool_bytes - mem_free)),
            Segment("mem_free", mem_free),
        )
        target = node.id == numa_node
        available = pool_free if hugetlb else mem_free
        # What the bound node lacks, only where the request did not get it: an allocation that
        # succeeded took what it needed (the kernel reclaims page cache past MemFree).
        short = max(0, needed - available) if target and outcome != "ok" else 0
        nodes.append(
            NodeBar(
                node.id, node.mem_total, mem_free, pool_total, pool_free, segments, target, short
            )  # fmt: skip
        )
    return Picture(machine.name, backing, hugetlb, hugepage_size, numa_node, needed, outcome,
                   tuple(nodes))  # fmt: skip


def human(n: int) -> str:
    """Bytes in binary units with one decimal: 1073741824 -> '1.0 GiB', 0 -> '0 B'."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def page_size_name(n: int) -> str:
    """'2 MiB' for 2097152 (whole units: hugepage sizes are powers of two)."""
    for unit, mult in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= mult and n % mult == 0:
            return f"{n // mult} {unit}"
    return f"{n} B"


def describe_request(pic: Picture) -> str:
    """One line: what the request needs and where, and what happened."""
    where = f"on node {pic.numa_node}" if pic.numa_node >= 0 else "on any node"
    what = (
        f"{human(pic.needed)} of {page_size_name(pic.hugepage_size)} hugepages"
        if pic.hugetlb
        else f"{human(pic.needed)} of memory"
    )
    return f"request: {what} ({pic.backing}) {where} -> {pic.outcome}"


def describe_node(pic: Picture, n: NodeBar) -> str:
    """The numbers next to a node's bar."""
    size = page_size_name(pic.hugepage_size)
    text = (
        f"{size} pool {human(n.pool_free)} free of {human(n.pool_total)}; "
        f"memory {human(n.mem_free)} free of {human(n.mem_total)}"
    )
    if n.target:
        if n.short:
            text += f"; short {human(n.short)}"
        elif pic.outcome == "ok":
            text += "; the request fits"
        else:
            text += "; what is free here covers the request"
    return text


def _cells(nbytes: int, scale: int, width: int) -> float:
    return nbytes * width / scale


def _bar(pic: Picture, n: NodeBar, width: int) -> str:
    chars = dict((kind, ch) for kind, ch, _ in SEGMENTS)
    out: list[str] = []
    edge = 0.0
    for seg in n.segments:
        start = round(edge)
        edge += _cells(seg.nbytes, pic.scale, width)
        out += chars[seg.kind] * max(0, min(width, round(edge)) - start)  # never past the bar
    out += " " * (width - len(out))
    if n.target:
        # where the need ends, counted from the start of the free pages it would take
        first = 0 if pic.hugetlb else sum(s.nbytes for s in n.segments[:-1])
        at = min(width - 1, round(_cells(first + min(pic.needed, pic.scale), pic.scale, width)))
        at = max(0, at - 1) if pic.needed else 0
        out[at] = "|"
    return "".join(out[:width])


# The mark on the bound node's bar (the HTML page's legend says the same).
NEED_END = ("|", "where the request's need ends on its node")


def legend(pic: Picture) -> str:
    size = page_size_name(pic.hugepage_size)
    parts = [f"{ch} {text.format(size=size)}" for _, ch, text in SEGMENTS]
    if any(n.target for n in pic.nodes):
        parts.append(" ".join(NEED_END))
    return "  ".join(parts)


def render_bars(pic: Picture, width: int = 40) -> str:
    """One line per node (``*`` marks the node the request is bound to), then the request."""
    lines = [describe_request(pic)]
    labels = [f"node {n.node}{'*' if n.target else ' '}" for n in pic.nodes]
    w = max([len("request"), *map(len, labels)])  # node 10* and up: the bars stay aligned
    for label, n in zip(labels, pic.nodes, strict=True):
        lines.append(f"  {label:<{w}} [{_bar(pic, n, width)}]  {describe_node(pic, n)}")
    need = round(_cells(pic.needed, pic.scale, width))
    if pic.needed and not need:
        need = 1
    lines.append(f"  {'request':<{w}} [{'#' * need:<{width}}]  {human(pic.needed)}")
    lines.append(f"  {legend(pic)}")
    return "\n".join(lines)


def picture_of(d: Diagnosis) -> Picture | None:
    """The picture of a replay/preflight diagnosis (None if its request has no sizes)."""
    try:
        sizes = d.request.buffer_sizes()
        backing, hugepage_size, numa_node, _ = d.request.settings()
    except (ValueError, KeyError):  # a request sglang refuses before sizing anything
        return None
    return picture(d.machine, sizes, backing, hugepage_size, numa_node, d.run.outcome)


def bars_for(d: Diagnosis) -> str:
    """``render_bars`` of a diagnosis under a heading, ending in a newline; "" if there is
    nothing to draw."""
    pic = picture_of(d)
    return "" if pic is None else "memory per node:\n" + render_bars(pic) + "\n"
