"""Concurrency on the real kernel: 8 threads x 1000 alloc/free pairs leave nothing mapped."""

from __future__ import annotations

import os
import threading

import pytest
from conftest import proc_maps

from umbp_sim import Anonymous, AnonymousShm, UMBPHostMemAllocator, _native
from umbp_sim.leaks import collect_leaks

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
    # Under ASan or TSan (tox -e asan/tsan) the runtime maps memory of its own between two
    # snapshots (its allocator's regions, shadow), so /proc/self/maps cannot be compared
    # whole. There the allocator's kernel calls go through a TracingKernel whose ledger holds
    # every mapping and memfd it made and did not release; the normal build compares the
    # whole map.
    sanitized = any("libasan" in line or "libtsan" in line for line in proc_maps())
    kernel = _native.TracingKernel(linux_kernel, 0) if sanitized else linux_kernel
    a = UMBPHostMemAllocator(kernel=kernel)
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
    if sanitized:
        assert kernel.calls > THREADS * PAIRS * 2  # the allocator's calls went through it
        assert collect_leaks(kernel) == []
        before = [line for line in before if "/memfd:umbp_host_buffer" in line]
        after = [line for line in after if "/memfd:umbp_host_buffer" in line]
    assert after == before
    assert sorted(os.listdir("/proc/self/fd")) == fds_before
    assert a.snapshot() == {"live": [], "shm": []}
