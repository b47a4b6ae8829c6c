"""Handles name their kernel, tables outlive allocators, and a throwing kernel call leaks nothing
(issue 16, items 1-3), under the umbp-sim profile and, for the harness guarantees, mori's too."""

from __future__ import annotations

import copy
import ctypes
import logging
import os
import random
import threading

import pytest

import umbp_sim
from umbp_sim import _native
from umbp_sim.allocator import (
    Anonymous,
    AnonymousHugetlb,
    AnonymousShm,
    AnonymousShmHugetlb,
    UMBPHostMemAllocator,
)
from umbp_sim.errors import SimulatedCrash
from umbp_sim.faults import OPS, FaultPlan, FaultRule
from umbp_sim.host.leaks import collect_leaks
from umbp_sim.host.trace import instrument
from umbp_sim.machine import Machine
from umbp_sim.sim import SimHost, build_kernel

MiB = 1 << 20
BACKINGS = (Anonymous, AnonymousHugetlb, AnonymousShm, AnonymousShmHugetlb)
NOT_OWNED = "which no allocator on this kernel owns"


def _maps_and_fds() -> tuple[int, int]:
    # The buffers' own mappings (an AnonymousShm buffer maps its memfd), not all of them: the
    # process's allocators (ASan's, under tox -e asan) map memory of their own as they go.
    with open("/proc/self/maps") as f:
        maps = sum(1 for line in f if "/memfd:umbp_host_buffer" in line)
    return maps, len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("profile", ["umbp-sim", "mori-624002c"])
def test_a_handle_of_a_finished_simulation_cannot_unmap_a_live_real_buffer(caplog, profile):
    m = Machine.x86_64()
    with umbp_sim.simulate(m):
        old = UMBPHostMemAllocator(profile=profile).alloc(64 * 1024)
    real = UMBPHostMemAllocator(kernel=_native.LinuxKernel(), profile=profile)
    live = real.alloc(64 * 1024)
    assert old.kernel_id != live.kernel_id and old.serial != live.serial
    caplog.set_level(logging.WARNING, logger="umbp_sim.allocator")
    real.free(old)
    assert NOT_OWNED in caplog.records[-1].getMessage()
    assert old  # left untouched
    ctypes.memset(live.ptr, 0x5A, 64 * 1024)  # still mapped: no SIGSEGV
    real.free(live)
    assert not live


def test_serials_are_unique_across_kernels():
    seen = set()
    for _ in range(5):
        m = Machine.x86_64()
        with umbp_sim.simulate(m):
            h = UMBPHostMemAllocator().alloc(4096)
            seen.add(h.serial)
            UMBPHostMemAllocator().free(h)
    assert len(seen) == 5 and 0 not in seen


def test_the_table_belongs_to_the_kernel_not_the_last_allocator():
    kernel = _native.LinuxKernel()
    before = _maps_and_fds()
    for _ in range(1000):
        a = UMBPHostMemAllocator(kernel)
        h = a.alloc(4096, AnonymousShm)
        del a  # the last allocator on this kernel is gone; its buffers are not forgotten
        b = UMBPHostMemAllocator(kernel)
        b.free(h)
        assert not h
    assert _maps_and_fds() == before


def _host(rules):
    m = Machine.x86_64(
        nodes=2, mem_per_node="16GiB", hugepages={"2MiB": 64}, kernel_version="5.10.0"
    )
    host = SimHost(m, build_kernel(m))
    st = instrument(host.kernel, FaultPlan(tuple(rules)))
    return host, st


@pytest.mark.parametrize("backing", BACKINGS, ids=lambda b: b.name)
def test_a_throwing_kernel_call_at_any_step_leaks_nothing(backing):
    # kernel 5.10: MADV_POPULATE_WRITE is EINVAL, so the touch path runs too
    fired = 0
    for op in OPS:
        for nth in range(1, 4):
            host, st = _host([FaultRule(op=op, nth=nth, throw="bad_alloc")])
            alloc = UMBPHostMemAllocator(st.kernel)
            h = alloc.alloc(4 * MiB, backing, numa_node=1)
            for _ in range(2):  # a Free whose munmap threw keeps the handle: free it again
                if h:
                    alloc.free(h)
            assert not h
            extra = alloc.alloc(4096)  # closes a memfd whose close() threw (if any)
            while extra:
                alloc.free(extra)
            fired += len(st.faulty.records()) if st.faulty is not None else 0
            assert collect_leaks(host, alloc, st.kernel) == [], (op, nth)
    assert fired >= 8  # most steps of each backing were reached and threw


def test_random_faults_and_exceptions_from_threads_leak_nothing_on_the_real_kernel():
    rules = [
        FaultRule(op=op, probability=0.05, seed=i, throw="bad_alloc")
        for i, op in enumerate(("mmap", "madvise", "memfd_create", "ftruncate", "mbind"))
    ] + [
        FaultRule(op="mmap", probability=0.05, seed=11, errno="ENOMEM"),
        FaultRule(op="madvise", probability=0.05, seed=12, errno="EAGAIN"),
        FaultRule(op="ftruncate", probability=0.05, seed=13, errno="EFBIG"),
    ]
    errors: list[BaseException] = []

    def worker(seed: int, kernel) -> None:
        rnd = random.Random(seed)
        alloc = UMBPHostMemAllocator(kernel)
        try:
            for _ in range(2500):
                h = alloc.alloc(rnd.choice((4096, 65536)), rnd.choice((Anonymous, AnonymousShm)),
                                numa_node=rnd.choice((-1, 0)))  # fmt: skip
                while h:
                    alloc.free(h)
        except (SimulatedCrash, Exception) as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def run(kernel) -> None:
        threads = [threading.Thread(target=worker, args=(s, kernel)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    # The TracingKernel's ledger holds every mapping and fd the allocator made and did not
    # release (glibc's own thread stacks and arenas, which /proc/self/maps also shows, are not).
    st = instrument(_native.LinuxKernel(), FaultPlan(tuple(rules)))
    fds = len(os.listdir("/proc/self/fd"))
    run(st.kernel)
    last = UMBPHostMemAllocator(st.kernel)
    extra = last.alloc(4096)  # closes any memfd whose close() threw
    while extra:
        last.free(extra)
    assert errors == []
    assert len(st.faulty.records()) > 500  # the faults did fire, throws included
    assert collect_leaks(st.kernel, last) == []
    assert len(os.listdir("/proc/self/fd")) == fds
    with open("/proc/self/maps") as f:
        assert "umbp_host_buffer" not in f.read()


# ---- issue 26, point 8: a handle that outlives its host; fork while another thread allocates


GONE = (
    r"UMBPHostBufferHandle\(serial=\d+, requested_size=1048576\)\.ptr: the simulated host this "
    r"buffer was allocated on is gone \(its SimKernel was destroyed, and the buffer's memory "
    r"with it\); keep the host, or an allocator on it, alive while the buffer is in use"
)


def test_a_handle_that_outlives_its_host_raises_on_use():
    import gc

    from umbp_sim.errors import HostGoneError

    with umbp_sim.simulate(Machine.x86_64()):
        h = UMBPHostMemAllocator().alloc(1 << 20)
        alive = h.ptr  # while the host lives, the address is usable
        ctypes.memset(alive, 1, 4096)
    gc.collect()
    with pytest.raises(HostGoneError, match="^" + GONE + "$"):
        h.ptr  # noqa: B018 - the use under test
    with pytest.raises(HostGoneError, match=GONE):
        copy.copy(h).ptr  # noqa: B018
    assert h and h.serial and h.mapped_size == 1 << 20  # what it was stays readable
    assert repr(h).endswith("(its simulated host is gone)>")
    # Freeing it anywhere is the usual refusal (a warning), never an unmap.
    UMBPHostMemAllocator(kernel=_native.LinuxKernel()).free(h)
    assert h


def test_a_handle_whose_host_is_alive_stays_usable_after_its_wrappers_go():
    host = SimHost(Machine.x86_64())
    st = instrument(host.kernel)
    h = UMBPHostMemAllocator(st.kernel).alloc(1 << 20)
    del st
    ctypes.memset(h.ptr, 1, 4096)  # the SimKernel (and the memory) is still there
    real = UMBPHostMemAllocator(kernel=_native.LinuxKernel()).alloc(4096)
    ctypes.memset(real.ptr, 1, 4096)  # a real buffer's memory never goes with its kernel object
    assert host.mappings()


def _wait_all(pids: list[int], timeout: float) -> list[object]:
    import time

    deadline = time.monotonic() + timeout
    status: dict[int, object] = {}
    while len(status) < len(pids) and time.monotonic() < deadline:
        for pid in pids:
            if pid not in status:
                done, st = os.waitpid(pid, os.WNOHANG)
                if done:
                    status[pid] = os.waitstatus_to_exitcode(st)
        time.sleep(0.01)
    for pid in pids:
        if pid not in status:  # hung: ours to end
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            status[pid] = "hung"
    return [status[p] for p in pids]


@pytest.mark.parametrize("backing", [AnonymousHugetlb, AnonymousShm], ids=lambda b: b.name)
def test_fork_while_another_thread_allocates_leaves_the_child_able_to_allocate(backing):
    import warnings

    host = SimHost(Machine.x86_64(nodes=2, hugepages={"2MiB": 64}))
    st = instrument(host.kernel)
    alloc = UMBPHostMemAllocator(st.kernel)
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            h = alloc.alloc(2 * MiB, backing, numa_node=1)
            alloc.free(h)

    threads = [threading.Thread(target=churn) for _ in range(2)]
    for t in threads:
        t.start()
    pids = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.12: fork with threads
            for _ in range(8):
                pid = os.fork()
                if pid == 0:  # the child: allocate on the inherited host, then on the real one
                    code = 3
                    try:
                        h = alloc.alloc(2 * MiB, backing, numa_node=0)
                        got = bool(h)
                        alloc.free(h)
                        r = UMBPHostMemAllocator(kernel=_native.LinuxKernel()).alloc(4096)
                        with umbp_sim.simulate(Machine.x86_64()):
                            s = UMBPHostMemAllocator().alloc(4096)
                        code = 0 if (got and r and s) else 1
                    finally:
                        os._exit(code)
                pids.append(pid)
                threading.Event().wait(0.02)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert _wait_all(pids, timeout=30) == [0] * 8
