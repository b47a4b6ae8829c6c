"""Admin writes a run makes on its fresh host before the work, as data the engine applies:
``PoolWrite`` (a hugepage pool setting), applied by :func:`apply_change`. Whoever asks for a
write (a replay's fix, a test) hands the engine these values, never a function to call, so the
same write goes to an external build's server field by field (``umbp_sim.external.wire``).
"""

from __future__ import annotations

from dataclasses import dataclass

from umbp_sim.sim import SimHost

__all__ = ["HostChange", "PoolWrite", "apply_change"]


@dataclass(frozen=True)
class PoolWrite:
    """An admin write of a hugepage pool setting: ``nr_hugepages`` or
    ``nr_overcommit_hugepages`` of one page size, host-wide or (``node``) one node's."""

    setting: str  # "nr_hugepages" | "nr_overcommit_hugepages"
    size: int
    count: int
    node: int | None = None

    @property
    def target(self) -> tuple[str, int, int | None]:
        """The file written: two writes with one target leave only the last one's value."""
        return (self.setting, self.size, self.node)


HostChange = PoolWrite  # the admin writes a Run carries (Run.changes)


def apply_change(host: SimHost, change: HostChange) -> str | None:
    """``change`` made on ``host``: a note when the kernel did not do all it was asked ("the
    kernel made only 3 of 8 pages"), else None."""
    if not isinstance(change, PoolWrite):
        raise TypeError(f"an admin write is a PoolWrite (data), not a {type(change).__name__}")
    if change.setting == "nr_overcommit_hugepages":
        try:
            host.set_nr_overcommit_hugepages(change.size, change.count)
        except OSError as e:
            return f"the kernel refused nr_overcommit_hugepages={change.count}: {e.strerror}"
        return None
    node, size, count = change.node, change.size, change.count
    before = host.node_hugepages(node, size) if node is not None else host.hugepages(size)
    try:
        host.set_nr_hugepages(size, count, node)
    except OSError as e:
        return f"the kernel refused nr_hugepages={count}: {e.strerror}"
    after = host.node_hugepages(node, size) if node is not None else host.hugepages(size)
    if after.total < count and after.total >= before.total:
        where = f"node {node}" if node is not None else "the host"
        return f"the kernel made only {after.total} of {count} pages on {where}"
    return None
