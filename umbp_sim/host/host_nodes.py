"""A host's NUMA nodes and their hugepage pools as ``Machine`` holds them, with the checks
of their values (node ids, page counts) that ``Machine.validate`` and the scenario types use."""

from __future__ import annotations

from dataclasses import dataclass, field

from umbp_sim.vocabulary.value_types import (
    MAX_BYTES,
    MAX_INT,
    Array,
    Custom,
    Int,
    Size,
    Str,
    Table,
    ValueTypeError,
)


@dataclass
class HugePool:
    """One hugepage size on one node, in pages."""

    total: int = 0
    free: int | None = None  # None: all of ``total`` is free
    surplus: int = 0

    def free_pages(self) -> int:
        """Free pages: ``free``, or ``total`` when ``free`` is None."""
        return self.total if self.free is None else self.free


@dataclass
class Node:
    """One NUMA node: its memory (bytes), CPUs, hugepage pools and distances.

    >>> Node(1, 64 << 30, hugepages={2 << 20: HugePool(total=512, free=100)}).id
    1
    """

    id: int
    mem_total: int  # bytes
    mem_free: int | None = None  # bytes; None: SimKernel derives it (kernel/sim_rules.h)
    # Reclaimable memory on the node (bytes): page cache (the file LRU) and SReclaimable.
    # None: the node's share (by mem_total) of the Machine's page_cache / slab_reclaimable.
    page_cache: int | None = None
    slab_reclaimable: int | None = None
    cpus: str = ""  # cpulist, e.g. "0-15"
    hugepages: dict[int, HugePool] = field(default_factory=dict)  # size (bytes) -> pool
    distances: list[int] | None = None


# node ids: 0..MAX_NODE_ID (a dump's, a scenario's); hugepage sizes per host: a few.
MAX_NODE_ID = 1023
NODE_ID = Int(0, MAX_NODE_ID)
# a page count; times its size it must stay below 2^62 (validate)
PAGES = Int(0, MAX_BYTES, "pages is beyond what the simulator holds (below 2^62 bytes)")


def node_ok(node: object, key: str) -> None:
    if not isinstance(node, Node):
        raise ValueTypeError(key, f"expected a Node, got {type(node).__name__}")
    NODE_ID.check(node.id, f"{key}.id")
    for name in ("mem_total", "mem_free", "page_cache", "slab_reclaimable"):
        if name == "mem_total" or getattr(node, name) is not None:
            Int(0, MAX_BYTES - 1).check(getattr(node, name), f"{key}.{name}")
    Str().check(node.cpus, f"{key}.cpus")
    Table(Custom(pool_ok, "a HugePool"), key=Size(written=False)).check(
        node.hugepages, f"{key}.hugepages"
    )
    if node.distances is not None:
        Array(Int(0, MAX_INT), max_len=MAX_NODE_ID + 1).check(node.distances, f"{key}.distances")


def pool_ok(pool: object, key: str) -> None:
    if not isinstance(pool, HugePool):
        raise ValueTypeError(key, f"expected a HugePool, got {type(pool).__name__}")
    for name in ("total", "free", "surplus"):
        if name != "free" or pool.free is not None:
            Int(None, MAX_BYTES, PAGES.beyond).check(getattr(pool, name), f"{key}.{name}")
