"""The named 2-node hosts compare's matrix runs on and ``umbp-sim exec --machine NAME`` starts:
no hugepages, the field's "pool all on node 0", or pools on both nodes. In the host layer, so
compare and exec each take them from here and neither borrows from the other.
"""

from __future__ import annotations

import functools

from umbp_sim.machine import Machine

POOLS = ("no-pool", "pool-on-node0", "ample")


@functools.cache
def machine(pool: str, kernel: str = "6.8.0", mem_per_node: str = "64GiB") -> Machine:
    """A 2-node host: no hugepages, the field's 'pool all on node 0', or pools on both.

    One object per (pool, kernel, memory), shared by the runs (nothing changes a run's
    machine)."""
    per_node: list[dict[int | str, int]]
    if pool == "no-pool":
        per_node = [{}, {}]
    elif pool == "pool-on-node0":
        per_node = [{"2MiB": 64, "1GiB": 1}, {}]
    elif pool == "ample":
        per_node = [{"2MiB": 1024, "1GiB": 2}, {"2MiB": 1024, "1GiB": 2}]
    else:
        raise ValueError(f"unknown pool state {pool!r}")
    m = Machine.x86_64(
        nodes=2, mem_per_node=mem_per_node, hugepages_per_node=per_node, kernel_version=kernel
    )
    m.name = f"{pool} k{kernel}"
    return m
