"""The one allocation request: ``UMBPHostMemAllocator.alloc(size, backing, hugepage_size,
numa_node, prefault)`` with mori's defaults.

Every place that asks the allocator for a buffer carries it: a scenario's ``[request]`` table or
``alloc`` step (``AllocRequest.from_table``, read once per run), the hypothesis strategy
``umbp_sim.strategies.alloc_requests``, a replay's raw request
(``umbp_sim.diagnose.replay_request.Request.alloc_request``) and an external build's run
(the engine's ``Alloc`` work carries it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from umbp_sim.vocabulary.units import parse_size

__all__ = ["AllocRequest"]


@dataclass(frozen=True)
class AllocRequest:
    """One ``UMBPHostMemAllocator.alloc`` call; ``backing`` is a ``UMBPHostBufferBacking`` name.

    >>> req = AllocRequest(4096, "AnonymousHugetlb", numa_node=0)
    >>> req.table()["backing"], req.args()[1]
    ('AnonymousHugetlb', <UMBPHostBufferBacking.AnonymousHugetlb: 1>)
    """

    size: int
    backing: str = "Anonymous"
    hugepage_size: int = 2 << 20
    numa_node: int = -1
    prefault: bool = True

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> AllocRequest:
        """A scenario ``[request]`` table or ``alloc`` step (sizes as numbers or ``"2MiB"``)."""
        return cls(
            parse_size(table["size"], "size"),
            table.get("backing", "Anonymous"),
            parse_size(table.get("hugepage_size", 2 << 20), "hugepage_size"),
            int(table.get("numa_node", -1)),
            bool(table.get("prefault", True)),
        )

    def fields(self) -> tuple[int, str, int, int, bool]:
        """(size, backing name, hugepage_size, numa_node, prefault)."""
        return self.size, self.backing, self.hugepage_size, self.numa_node, self.prefault

    def args(self) -> tuple[int, Any, int, int, bool]:
        """Positional arguments of ``UMBPHostMemAllocator.alloc`` (the backing as its enum)."""
        from umbp_sim import _native  # the binding's enum (umbp_sim.allocator re-exports it)

        backing = getattr(_native.UMBPHostBufferBacking, self.backing)
        return self.size, backing, self.hugepage_size, self.numa_node, self.prefault

    def table(self) -> dict[str, Any]:
        """The request as a scenario ``[request]`` table (or an ``alloc`` step's keys)."""
        return asdict(self)

    def label(self) -> str:
        """The call as a person reads it (``alloc(size=4096, Anonymous, ...)``)."""
        return (
            f"alloc(size={self.size}, {self.backing}, hugepage_size={self.hugepage_size}, "
            f"numa_node={self.numa_node}, prefault={self.prefault})"
        )
