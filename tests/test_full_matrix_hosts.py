"""issue 41: the full matrix's hosts are small (8 GiB nodes) and keep its classes of behaviour:
a run's cost grows with what the allocator does, not with the simulated memory it touches."""

from __future__ import annotations

import itertools
from typing import Any

from umbp_sim.allocator_spec import AllocatorSpec
from umbp_sim.comparison import matrix
from umbp_sim.comparison.differences import differences
from umbp_sim.request import AllocRequest
from umbp_sim.run_router import BuiltinAllocator
from umbp_sim.vocabulary.backing import BACKINGS

GiB = 1 << 30


def _behaviour(rec: Any) -> tuple[Any, ...]:
    """What an allocator did, without its numbers (bench/bench_full_matrix.py's classes)."""
    ids = tuple(sorted({str(i) for _logger, i, _text in rec.log}))
    rules = tuple(sorted({r.rule for r in rec.reasons}))
    return rec.outcome, rec.failure, rec.actual_backing, rec.signal, rec.stage, ids, rules


def test_the_full_matrix_runs_on_8_gib_nodes() -> None:
    # the innermost dimensions: fault plans, kernels, pool states
    runs = itertools.islice(matrix.full(), len(matrix.POOLS) * len(matrix.KERNELS) * 8)
    hosts = {id(r.machine): r.machine for r in runs}
    assert {n.mem_total for m in hosts.values() for n in m.nodes} == {8 * GiB}
    assert len(hosts) == len(matrix.POOLS) * len(matrix.KERNELS)


def test_a_request_past_the_host_is_killed_after_touching_8_gib_nodes() -> None:
    """A 1 TiB buffer prefaulted by hand (kernel 4.9) still ends in the OOM kill, and a 1 GiB
    buffer bound to either node still fits beside the 'ample' pools."""
    mori = BuiltinAllocator(AllocatorSpec("builtin", "mori-624002c"))
    mem = matrix.FULL_MEM_PER_NODE
    big = matrix._run("ample", AllocRequest(1 << 40, "AnonymousShm", prefault=True), "4.9.0",
                      mem_per_node=mem)  # fmt: skip
    rec = mori.run(big)
    assert (rec.outcome, rec.signal) == ("crashed", "SIGKILL")
    for node in (0, 1):
        call = AllocRequest(GiB, "Anonymous", numa_node=node, prefault=True)
        rec = mori.run(matrix._run("ample", call, "4.9.0", mem_per_node=mem))
        assert (rec.outcome, rec.actual_backing, rec.bound_node) == ("ok", "Anonymous", node)


def test_the_runs_that_touch_memory_behave_alike_on_8_and_64_gib_nodes() -> None:
    """1 GiB and 1 TiB buffers, every backing, kernel and pool state, prefault (by hand before
    5.14 and after madvise's EAGAIN), bound or not: on both host sizes each built-in
    allocator's class of behaviour and the classes in which the two differ are the same."""
    a = BuiltinAllocator(AllocatorSpec("builtin", "umbp-sim"))
    b = BuiltinAllocator(AllocatorSpec("builtin", "mori-624002c"))
    product = itertools.product(
        (GiB, 1 << 40), BACKINGS, (-1, 1), matrix.POOLS, matrix.KERNELS, (None, "madvise")
    )
    for size, backing, node, pool, kernel, fault in product:
        call = AllocRequest(size, backing, GiB, node, prefault=True)
        seen = []
        for mem in (matrix.FULL_MEM_PER_NODE, "64GiB"):
            run = matrix._run(pool, call, kernel, fault, mem)
            ra, rb = a.run(run), b.run(run)
            seen.append((_behaviour(ra), _behaviour(rb), sorted(differences(ra, rb))))
        assert seen[0] == seen[1], run.label
