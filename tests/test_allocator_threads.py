"""Concurrency on the real kernel: 8 threads x 1000 alloc/free pairs leave nothing mapped."""

from __future__ import annotations

import os
import threading

import pytest
from conftest import proc_maps

from umbp_sim import Anonymous, AnonymousShm, UMBPHostMemAllocator, _native
from umbp_sim.host.leaks import collect_leaks

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


@pytest.mark.threads
def test_threads_leave_nothing_mapped(linux_kernel):
    # Only this test's own mappings are compared: the process maps memory of its own meanwhile
    # (glibc's thread stacks and malloc arenas, a sanitizer's regions), so the whole of
    # /proc/self/maps differs by chance. The allocator's calls go through a TracingKernel whose
    # ledger holds every mapping and memfd it made and did not release; the memfd mappings are
    # the allocator's by name, and must be gone from /proc/self/maps too.
    kernel = _native.TracingKernel(linux_kernel, 0)
    a = UMBPHostMemAllocator(kernel=kernel)
    old_stack = threading.stack_size(1 << 20)
    try:
        assert run_threads(a, 10) == []
        fds_before = sorted(os.listdir("/proc/self/fd"))
        assert run_threads(a, PAIRS) == []
    finally:
        threading.stack_size(old_stack)
    assert kernel.calls > THREADS * PAIRS * 2  # the allocator's calls went through it
    assert collect_leaks(kernel) == []
    assert [line for line in proc_maps() if "/memfd:umbp_host_buffer" in line] == []
    assert sorted(os.listdir("/proc/self/fd")) == fds_before
    assert a.snapshot() == {"live": [], "shm": []}
