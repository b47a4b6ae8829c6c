"""The runs ``umbp-sim compare`` puts both allocators through.

The bundled scenarios (those that make one ``alloc``, and the ``steps`` ones both allocators can
do: the shm registry's acquire, lookup and release only where both have it) plus a request
matrix over backings x sizes x hugepage sizes x nodes x prefault x pool states x kernel versions
x fault plans on every syscall. ``quick`` (the default) crosses the dimensions in groups around
the field's cases so a comparison takes seconds; ``full`` is the complete product (long: tens
of thousands of runs).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator

from umbp_sim.engine.spec import Alloc, Run, Steps
from umbp_sim.faults import FaultPlan
from umbp_sim.host.named_machines import POOLS, machine
from umbp_sim.machine import Machine
from umbp_sim.request import AllocRequest
from umbp_sim.vocabulary.backing import BACKINGS

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
PAGE = 4096

SIZES = {
    "0": 0,
    "1": 1,
    "page-1": PAGE - 1,
    "page": PAGE,
    "3MiB": 3 * MiB,
    "1GiB": GiB,
    "huge": 1 * TiB,
    "2^63": 1 << 63,
}
# Sizes at the top of size_t (quick matrix): rounding most of them up overflows; the highest
# multiple of a page and of a 2 MiB hugepage are the edges of an allocator's overflow check.
TOP_SIZES = (2**64 - 1, 2**64 - PAGE, 2**64 - MiB, 2**64 - 2 * MiB)
HUGEPAGE_SIZES = {"1": 1, "4096": 4096, "2MiB": 2 * MiB, "3MiB": 3 * MiB, "1GiB": GiB}
NODES = {"-1": -1, "0": 0, "1": 1, "63": 63, "out-of-range": 4, "2^31-1": 2**31 - 1}
KERNELS = ("3.10.0", "4.9.0", "5.10.0", "6.8.0")
# Field-sized requests (quick matrix): sglang's host pools are tens to hundreds of GiB, and
# RHEL 8's 4.18 kernel has no MADV_POPULATE_WRITE (5.14), so a prefault touches every page by
# hand. Past 4 GiB a touch loop with a 32-bit offset wraps and never ends.
FIELD_KERNEL = "4.18.0"
FIELD_SIZES = (5 * GiB, 100 * GiB)
# The full matrix's hosts: a node holds the 'ample' pools (4 GiB) and a 1 GiB buffer beside
# them; what costs a run is what the allocator does, and a 1 TiB request touched by hand on a
# kernel before 5.14 touches the whole host before the OOM kill (bench/bench_full_matrix.py
# shows its classes of behaviour and a mutant set's kills are those of 64 GiB nodes).
FULL_MEM_PER_NODE = "8GiB"
# One fault per syscall the allocators make, on its first call.
FAULTS = {
    "mmap": "ENOMEM",
    "munmap": "EINVAL",
    "madvise": "EAGAIN",
    "mbind": "EIO",
    "memfd_create": "EMFILE",
    "ftruncate": "ENOSPC",
    "close": "EIO",
}


@functools.cache
def big_page_machine() -> Machine:
    """A ppc64le host with the hash MMU's 16 GiB hugepages (2 of them on node 0): a size of
    2^32 bytes or more in mmap's MAP_HUGE_SHIFT field."""
    m = Machine.ppc64le(
        mmu="hash", nodes=2, mem_per_node="64GiB",
        hugepages_per_node=[{"16GiB": 2}, {}], kernel_version="6.8.0",
    )  # fmt: skip
    m.name = "ppc64le-16GiB-pages k6.8.0"
    return m


@functools.cache
def field_machine() -> Machine:
    """A 2-node x86_64 host of 256 GiB on RHEL 8's kernel with 56 1 GiB hugepages on each node:
    room for a 100 GiB buffer of base pages or of 1 GiB pages."""
    m = Machine.x86_64(
        nodes=2, mem_per_node="128GiB", hugepages_per_node=[{"1GiB": 56}, {"1GiB": 56}],
        kernel_version=FIELD_KERNEL,
    )  # fmt: skip
    m.name = f"field-256GiB k{FIELD_KERNEL}"
    return m


@functools.cache
def fault_plan(op: str) -> FaultPlan:
    return FaultPlan.from_rules([{"op": op, "errno": FAULTS[op], "nth": 1}])


def _run(
    pool: str,
    call: AllocRequest,
    kernel: str = "6.8.0",
    fault: str | None = None,
    mem_per_node: str = "64GiB",
) -> Run:
    plan = fault_plan(fault) if fault else None
    label = f"[{pool} k{kernel}{' ' + fault + ':' + FAULTS[fault] if fault else ''}] {call.label()}"
    return Run(machine(pool, kernel, mem_per_node), _life(call), plan=plan, label=label)


def _life(call: AllocRequest) -> Alloc:
    """A run's work: allocate, write the first byte as a user would, free, free again."""
    return Alloc(call, write=True, free=True, free_twice=True)


# Several allocations in one process (the quick matrix's other runs are one alloc each): two
# in a row (a once-per-process fallback warning shows once, a per-call one twice), one freed,
# one more after that free, the rest freed; on a kernel that touches by hand and one that
# populates.
SEQUENCE_KERNELS = ("4.9.0", "6.8.0")
SEQUENCE = ("alloc a", "alloc b", "free a", "alloc c", "free b", "free c")


def _sequence(pool: str, kernel: str, backing: str) -> Run:
    table = {"size": 4 * MiB, "backing": backing, "prefault": True}
    steps = tuple(
        {"op": op, "id": name, **(table if op == "alloc" else {})}
        for op, name in (s.split() for s in SEQUENCE)
    )
    label = f"[{pool} k{kernel}] steps({', '.join(SEQUENCE)}; size={4 * MiB}, {backing})"
    return Run(machine(pool, kernel), Steps(steps), label=label)


def quick() -> Iterator[Run]:
    size = 4 * MiB
    for b, s, p, pool in itertools.product(BACKINGS, SIZES.values(), (True, False), POOLS):
        yield _run(pool, AllocRequest(s, b, prefault=p))
    for b, hp, p, pool in itertools.product(
        ("AnonymousHugetlb", "AnonymousShmHugetlb"),
        (*HUGEPAGE_SIZES.values(), 0),
        (True, False),
        POOLS,
    ):  # 3 MiB: not a multiple of any hugepage size (rounding and unmapping show); size 0 too
        yield _run(pool, AllocRequest(3 * MiB, b, hugepage_size=hp, prefault=p))
    for b, n, pool in itertools.product(BACKINGS, NODES.values(), POOLS):
        yield _run(pool, AllocRequest(size, b, numa_node=n))
    for b, k, p, pool in itertools.product(BACKINGS, KERNELS, (True, False), POOLS):
        yield _run(pool, AllocRequest(size, b, numa_node=1, prefault=p), kernel=k)
    for b, op, s in itertools.product(BACKINGS, FAULTS, (size, size + 1)):
        # and a size no page divides: what an error path says of the size shows
        yield _run("ample", AllocRequest(s, b, numa_node=0), fault=op)
    for b, s in itertools.product(BACKINGS, TOP_SIZES):  # rounding up past 2^64
        yield _run("ample", AllocRequest(s, b))
    field = field_machine()
    for s, b in itertools.product(FIELD_SIZES, BACKINGS):  # touched by hand: prefault on 4.18
        call = AllocRequest(s, b, hugepage_size=GiB, prefault=True)
        yield Run(field, _life(call), label=f"[{field.name}] {call.label()}")
    for b, pool, k in itertools.product(BACKINGS, POOLS, SEQUENCE_KERNELS):
        yield _sequence(pool, k, b)
    big = big_page_machine()
    for b in ("AnonymousHugetlb", "AnonymousShmHugetlb"):
        call = AllocRequest(16 * GiB, b, hugepage_size=16 * GiB)
        yield Run(big, _life(call), label=f"[{big.name}] {call.label()}")


def full(mem_per_node: str = FULL_MEM_PER_NODE) -> Iterator[Run]:
    """The complete product, on hosts of ``mem_per_node`` a node (8 GiB: the smallest that
    keeps every pool state's room for a 1 GiB buffer beside its pools, so a request past the
    host, touched by hand until the OOM kill, costs an eighth of what it did on 64 GiB)."""
    for b, s, hp, n, p, pool, k in itertools.product(
        BACKINGS, SIZES.values(), HUGEPAGE_SIZES.values(), NODES.values(), (True, False), POOLS,
        KERNELS,
    ):  # fmt: skip
        for fault in (None, *FAULTS):
            yield _run(pool, AllocRequest(s, b, hp, n, p), k, fault, mem_per_node)


def scenario_runs(registry: bool = True) -> Iterator[Run]:
    """The bundled scenarios whose request is one alloc, or steps, as runs: the steps those of
    any build can do, and with ``registry`` (both builds have the shm registry) those that
    acquire, look up or release too."""
    from umbp_sim.scenario.bundled import bundled_scenarios_dir
    from umbp_sim.scenario.external_scenario import steps_not_runnable
    from umbp_sim.scenario.scenario_run import build_machine
    from umbp_sim.scenario.schema import find_scenarios, load_scenario

    for path in find_scenarios([str(bundled_scenarios_dir())]):
        scn = load_scenario(path)
        if scn.request_kind not in ("alloc", "steps") or scn.env:
            continue
        if steps_not_runnable(scn, registry) is not None:
            continue
        work: Alloc | Steps = (
            _life(AllocRequest.from_table(scn.request))
            if scn.request_kind == "alloc"
            else Steps(tuple(scn.request["steps"]))
        )
        plan = FaultPlan.from_dict({"faults": scn.faults, "fault_seed": scn.fault_seed})
        label = f"scenario {scn.label}"
        yield Run(build_machine(scn), work, plan=plan if scn.faults else None, label=label)
