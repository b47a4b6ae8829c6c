"""Concurrency on the real kernel: 8 threads x 1000 alloc/free pairs leave nothing mapped."""

from __future__ import annotations

import os
import threading

from conftest import proc_maps

from umbp_sim import Anonymous, AnonymousShm, UMBPHostMemAllocator

PAGE = os.sysconf("SC_PAGESIZE")
THREADS = 8
PAIRS = 1000


def run_threads(a: UMBPHostMemAllocator, pairs: int) -> list[str]:
    errors: list[str] = []
    barrier = threading.Barrier(THREADS)

    def work(i: int) -> None:
        barrier.wait()
        for j in range(pairs):
            backing = AnonymousShm if (i + j) % 4 == 0 else Anonymous
            size = PAGE * (1 + (i * 7 + j) % 5)
            h = a.alloc(size, backing, prefault=j % 2 == 0)
            if not h or h.mapped_size != size or h.actual_backing != backing:
                errors.append(f"thread {i} pair {j}: {h!r} {h.actual_backing}")
                return
            if backing == AnonymousShm and a.lookup_shm_allocation(h.ptr, size) is None:
                errors.append(f"thread {i} pair {j}: shm not registered")
            a.free(h)
            if h:
                errors.append(f"thread {i} pair {j}: free did not invalidate")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_threads_leave_nothing_mapped(linux_kernel):
    a = UMBPHostMemAllocator(kernel=linux_kernel)
    # glibc keeps thread stacks (up to 40 MiB of them) and malloc arenas for reuse: small stacks
    # and a warm-up round make the second round map nothing new of its own.
    old_stack = threading.stack_size(1 << 20)
    try:
        assert run_threads(a, 10) == []
        fds_before = sorted(os.listdir("/proc/self/fd"))
        before = proc_maps()
        assert run_threads(a, PAIRS) == []
        after = proc_maps()
    finally:
        threading.stack_size(old_stack)
    assert after == before
    assert sorted(os.listdir("/proc/self/fd")) == fds_before
    assert a.snapshot() == {"live": [], "shm": []}
