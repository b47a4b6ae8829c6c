"""Writing nr_hugepages spreads and removes pages round-robin over the nodes, skipping nodes
that have none left (docs/kernel-model.md section 3: "interleaves over N_MEMORY nodes";
mm/hugetlb.c for_each_node_mask_to_free). Found by the stateful exploration (umbp_sim.explore):
the simulator used to give each round's remainder to the first nodes again instead of carrying
on around the ring."""

from __future__ import annotations

from umbp_sim.machine import Machine, MiB
from umbp_sim.sim import SimHost

HP = 2 * MiB


def _nodes(host: SimHost, n: int) -> list[int]:
    return [host.node_hugepages(i, HP).total for i in range(n)]


def test_shrink_removes_free_pages_round_robin_skipping_empty_nodes() -> None:
    # 5 pages to remove from (5, 1, 5): node 0, 1, 2, 0, then node 1 is empty, so node 2.
    host = SimHost(Machine.x86_64(nodes=3, hugepages_per_node=[{HP: 5}, {HP: 1}, {HP: 5}]))
    host.set_nr_hugepages(HP, 6)
    assert _nodes(host, 3) == [3, 0, 3]
    assert host.hugepages(HP).total == 6


def test_shrink_of_the_stateful_example() -> None:
    # (2, 4, 5, 0) down to 3: removed 0,1,2,0,1,2,1,2 -> (0, 1, 2, 0).
    pools = [{HP: 2}, {HP: 4}, {HP: 5}, {}]
    host = SimHost(Machine.x86_64(nodes=4, hugepages_per_node=pools))
    host.set_nr_hugepages(HP, 3)
    assert _nodes(host, 4) == [0, 1, 2, 0]


def test_grow_is_round_robin_and_bulk_sized_writes_stay_exact() -> None:
    host = SimHost(Machine.x86_64(nodes=3, mem_per_node="4TiB"))
    host.set_nr_hugepages(HP, 7)
    assert _nodes(host, 3) == [3, 2, 2]
    host.set_nr_hugepages(HP, 3_000_001)
    assert _nodes(host, 3) == [1_000_001, 1_000_000, 1_000_000]
