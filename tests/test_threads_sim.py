"""Several threads allocating and freeing on one simulated host under random faults.

At least 10^4 allocator calls; afterwards every hugepage counter is back where it started,
nothing is mapped, no fd is open, and the allocator holds nothing.
"""

from __future__ import annotations

import random
import threading

from umbp_sim import UMBPHostBufferBacking as B, UMBPHostMemAllocator
from umbp_sim.faults import FaultPlan
from umbp_sim.host.leaks import collect_leaks
from umbp_sim.host.trace import instrument
from umbp_sim.machine import Machine, MiB
from umbp_sim.sim import SimHost

THREADS = 4
PAIRS = 1250  # per thread: 4 x 1250 x (alloc + free) = 10^4 calls
BACKINGS = [B.Anonymous, B.AnonymousHugetlb, B.AnonymousShm, B.AnonymousShmHugetlb]

# Recoverable faults only: an injected munmap/close failure leaves the mapping or fd behind
# by design, and a signal kills the simulated process.
PLAN = FaultPlan.from_rules(
    [
        {"op": "mmap", "errno": "ENOMEM", "probability": 0.05},
        {"op": "madvise", "errno": "EFAULT", "probability": 0.05},
        {"op": "madvise", "errno": "ENOMEM", "probability": 0.03},
        {"op": "madvise", "errno": "EINVAL", "probability": 0.03},
        {"op": "mbind", "errno": "EINVAL", "probability": 0.1},
        {"op": "memfd_create", "errno": "EMFILE", "probability": 0.05},
        {"op": "ftruncate", "errno": "EINVAL", "probability": 0.05},
        {"op": "read_file", "errno": "EIO", "probability": 0.05},
    ],
    seed=11,
)


def test_threads_alloc_free_under_faults_balance() -> None:
    machine = Machine.x86_64(
        nodes=2, hugepages_per_node=[{"2MiB": 24}, {"2MiB": 8}], nr_overcommit_hugepages={"2MiB": 4}
    )
    host = SimHost(machine)
    stack = instrument(host.kernel, PLAN, limit=1000)
    allocator = UMBPHostMemAllocator(kernel=stack.kernel)
    before = (
        {n: host.node_hugepages(n, 2 * MiB) for n in (0, 1)},
        host.hugepages(2 * MiB),
        host.hugepages(1 << 30),
    )
    outcomes: dict[str, int] = {}
    calls = [0] * THREADS
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        rng = random.Random(i)
        held = []
        try:
            for _ in range(PAIRS):
                backing = rng.choice(BACKINGS)
                size = rng.choice([1, 4096, 2 * MiB, 3 * MiB + 5])
                node = rng.choice([-1, 0, 1, 7])
                h = allocator.alloc(size, backing, 2 * MiB, node, rng.random() < 0.8)
                calls[i] += 1
                kind = "failed" if not h else str(h.actual_backing).rsplit(".", 1)[-1]
                with lock:
                    outcomes[kind] = outcomes.get(kind, 0) + 1
                held.append(h)
                if len(held) > 3 or rng.random() < 0.5:
                    victim = held.pop(rng.randrange(len(held)))
                    allocator.free(victim)
                    calls[i] += 1
                    assert not victim
            for h in held:
                allocator.free(h)
                calls[i] += 1
        except BaseException as e:  # reported below: a thread's assert must fail the test
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sum(calls) >= 10_000
    # Every path was taken: hugetlb, demotion (faults / empty pool) and failure.
    assert {
        "Anonymous",
        "AnonymousHugetlb",
        "AnonymousShm",
        "AnonymousShmHugetlb",
        "failed",
    } <= set(outcomes), outcomes
    after = (
        {n: host.node_hugepages(n, 2 * MiB) for n in (0, 1)},
        host.hugepages(2 * MiB),
        host.hugepages(1 << 30),
    )
    assert after == before
    assert host.mappings() == []
    assert host.open_fds() == []
    assert collect_leaks(host, allocator, stack.kernel) == []


def test_simulate_is_per_thread_and_leaves_nothing_behind() -> None:
    """Two threads inside simulate() at once, leaving in the other order than they entered
    (issue 26, point 8): each allocator stands on its own thread's host, a thread outside any
    block (the main one) stays on the real kernel, and nothing is left once both are out."""
    from umbp_sim import _context, simulate
    from umbp_sim.allocator import real_kernel

    both_in = threading.Barrier(3)
    first_out = threading.Event()
    seen: dict[str, object] = {}
    errors: list[BaseException] = []

    def worker(name: str, leave_first: bool) -> None:
        try:
            with simulate(Machine.x86_64(name=name)) as host:
                both_in.wait(timeout=30)
                a = UMBPHostMemAllocator()
                seen[name] = a.kernel is host.kernel
                h = a.alloc(1 << 20, B.AnonymousShm)
                seen[name + "_mapped"] = len(host.mappings())
                a.free(h)
                if not leave_first:
                    assert first_out.wait(timeout=30)
            if leave_first:
                first_out.set()
            seen[name + "_after"] = _context.current_kernel()
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [
        threading.Thread(target=worker, args=("a", False)),
        threading.Thread(target=worker, args=("b", True)),
    ]
    for t in threads:
        t.start()
    both_in.wait(timeout=30)
    main_allocator = UMBPHostMemAllocator()  # on the main thread, outside any block
    for t in threads:
        t.join()
    assert errors == []
    assert seen == {
        "a": True, "b": True, "a_mapped": 1, "b_mapped": 1, "a_after": None, "b_after": None,
    }  # fmt: skip
    assert main_allocator.kernel is real_kernel()
    assert _context.current_kernel() is None
    assert UMBPHostMemAllocator().kernel is real_kernel()
