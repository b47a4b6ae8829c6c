"""What a fix leaves on the nodes that hold the buffer: memory free or reclaimable, and free
hugepages of the buffer's size, as the fix's own run left the simulated host after the
allocation (``RunRecord.state_after``). A pool grown for the buffer takes its pages from the
node's memory: "ok" with 17 MiB left on the node is said, not hidden.
"""

from __future__ import annotations

from umbp_sim.diagnose.simulate import Simulation
from umbp_sim.vocabulary.backing import HUGETLB_BACKINGS
from umbp_sim.vocabulary.units import format_size

SMALL = 1 << 30  # memory left on a node below this is flagged


def _amount(n: int) -> str:
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    return f"{n >> 20} MiB"


def margin(run: Simulation | None) -> str | None:
    """``"node 1: 17 MiB of memory free or reclaimable (under 1 GiB), 0 free 2MiB pages"``,
    for a run that got a buffer; None otherwise."""
    if run is None or run.outcome not in ("ok", "demoted"):
        return None
    state = run.observed.state_after
    if state is None:
        return None
    _backing, hugepage_size, node, _prefault = run.request.settings()
    hugetlb = run.observed.actual_backing in HUGETLB_BACKINGS
    if node >= 0 and run.unbound is None and node in state.machine.node_ids():
        nodes = [node]
    else:
        nodes = [n.id for n in state.machine.nodes if n.mem_total > 0]
    parts = []
    for n in nodes:
        left = state.numbers.node(n).mem_free + state.reclaimable(n)
        text = f"node {n}: {_amount(left)} of memory free or reclaimable"
        if left < SMALL:
            text += " (under 1 GiB)"
        if hugetlb and hugepage_size in state.machine.hugepage_sizes:
            free = state.node_hugepages(n, hugepage_size).free
            text += f", {free} free {format_size(hugepage_size)} pages"
        parts.append(text)
    return "; ".join(parts)
