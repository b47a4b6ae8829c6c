"""mori's UMBP DRAM tier: a second ``HostMemAllocator`` allocation in the server's process, asked
for by the ``UMBP_DRAM_*`` environment (mori's ``UMBPDramConfig``; its defaults: 4 GiB, no
hugepages, 2 MiB pages when asked, no NUMA binding, prefaulted). A replay of a host that runs
it allocates it in each rank after that rank's HiCache host pool (sglang builds its host pool
before its storage backend, where the UMBP store and its DRAM tier start).
"""

from __future__ import annotations

from collections.abc import Mapping

from umbp_sim.request import AllocRequest

CAPACITY = "UMBP_DRAM_CAPACITY"
USE_HUGEPAGES = "UMBP_DRAM_USE_HUGEPAGES"
HUGEPAGE_SIZE = "UMBP_DRAM_HUGEPAGE_SIZE"
NUMA_NODE = "UMBP_DRAM_NUMA_NODE"
PREFAULT = "UMBP_DRAM_PREFAULT"
VARIABLES = (CAPACITY, USE_HUGEPAGES, HUGEPAGE_SIZE, NUMA_NODE, PREFAULT)

DEFAULT_CAPACITY = 4 << 30
DEFAULT_HUGEPAGE_SIZE = 2 << 20
MAX_BYTES = 1 << 62  # what the simulator holds


class DramTierError(ValueError):
    """A ``UMBP_DRAM_*`` value mori could not read: the text names the variable."""


def _int(env: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise DramTierError(f"{name}={raw.strip()[:40]!r}: expected an integer") from None
    if not low <= value <= high:
        raise DramTierError(f"{name}={value}: expected {low} to {high}")
    return value


def dram_tier_request(env: Mapping[str, str]) -> AllocRequest | None:
    """The DRAM tier's ``alloc`` call when ``env`` asks for the tier (any ``UMBP_DRAM_*``
    variable set), else None. A value mori could not read is a DramTierError naming it."""
    if not any(name in env for name in VARIABLES):
        return None
    size = _int(env, CAPACITY, DEFAULT_CAPACITY, 1, MAX_BYTES - 1)
    hugepages = _int(env, USE_HUGEPAGES, 0, -(1 << 31), (1 << 31) - 1) != 0
    page = _int(env, HUGEPAGE_SIZE, DEFAULT_HUGEPAGE_SIZE, 1, MAX_BYTES - 1)
    node = _int(env, NUMA_NODE, -1, -1, (1 << 31) - 1)
    prefault = _int(env, PREFAULT, 1, -(1 << 31), (1 << 31) - 1) != 0
    backing = "AnonymousHugetlb" if hugepages else "Anonymous"
    return AllocRequest(size, backing, page, node, prefault)


__all__ = ["VARIABLES", "DramTierError", "dram_tier_request"]
