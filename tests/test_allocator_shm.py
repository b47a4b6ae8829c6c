"""The shm registry on the real kernel: lookup bounds, acquire/free/release ordering."""

from __future__ import annotations

import logging
import os

import pytest
from conftest import mapping_of

from umbp_sim import AnonymousShm, UMBPHostMemAllocator

PAGE = os.sysconf("SC_PAGESIZE")
LOGGER = "umbp_sim.allocator"


def memfd_open(fd: int) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:umbp_host_buffer")
    except FileNotFoundError:
        return False


@pytest.fixture
def alloc(linux_kernel):
    return UMBPHostMemAllocator(kernel=linux_kernel)


def test_lookup_inside_and_outside(alloc):
    h = alloc.alloc(2 * PAGE, AnonymousShm)
    found = alloc.lookup_shm_allocation(h.ptr + 10, 100)
    assert (found.base, found.mapped_size, found.fd) == (h.ptr, 2 * PAGE, h.fd)
    assert repr(found) == f"<UMBPShmAllocation base={h.ptr:#x} mapped_size={2 * PAGE} fd={h.fd}>"
    assert alloc.lookup_shm_allocation(h.ptr, 2 * PAGE).base == h.ptr
    assert alloc.lookup_shm_allocation(h.ptr + 2 * PAGE - 1, 1).base == h.ptr
    # outside, straddling either end, empty, null
    assert alloc.lookup_shm_allocation(h.ptr + 2 * PAGE, 1) is None
    assert alloc.lookup_shm_allocation(h.ptr - 1, 2) is None
    assert alloc.lookup_shm_allocation(h.ptr, 2 * PAGE + 1) is None
    assert alloc.lookup_shm_allocation(h.ptr, 0) is None
    assert alloc.lookup_shm_allocation(0, 1) is None
    assert alloc.lookup_shm_allocation(2**64 - 1, 2) is None
    # lookup does not count a registration
    assert alloc.snapshot()["shm"][0]["active_registrations"] == 0
    # non-shm buffers are not in the registry
    anon = alloc.alloc(PAGE)
    assert alloc.lookup_shm_allocation(anon.ptr, 1) is None
    alloc.free(anon)
    alloc.free(h)
    assert alloc.lookup_shm_allocation(h.ptr, 1) is None


def test_free_with_registrations_defers_munmap_and_close(alloc, caplog):
    h = alloc.alloc(3 * PAGE, AnonymousShm)
    ptr, fd = h.ptr, h.fd
    assert alloc.acquire_shm_allocation(ptr + PAGE, 1).fd == fd
    assert alloc.acquire_shm_allocation(ptr, 3 * PAGE).base == ptr
    assert alloc.snapshot()["shm"][0]["active_registrations"] == 2

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        alloc.free(h)
    assert caplog.messages == [
        f"Free of AnonymousShm buffer {ptr:#x} ({3 * PAGE} bytes) while 2 registration(s) hold "
        "it; munmap and close deferred to the last ReleaseShmAllocation"
    ]
    assert not h and (h.ptr, h.mapped_size) == (0, 0)
    assert "/memfd:umbp_host_buffer" in mapping_of(ptr)
    assert memfd_open(fd)
    snap = alloc.snapshot()
    assert snap["live"] == []
    assert snap["shm"] == [
        {
            "base": ptr,
            "mapped_size": 3 * PAGE,
            "fd": fd,
            "active_registrations": 2,
            "pending_free": True,
        }
    ]
    # a freed allocation cannot be found or acquired again
    assert alloc.lookup_shm_allocation(ptr, 1) is None
    assert alloc.acquire_shm_allocation(ptr, 1) is None
    alloc.free(h)  # idempotent, still deferred

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        alloc.release_shm_allocation(ptr)
        assert "/memfd:umbp_host_buffer" in mapping_of(ptr)
        assert memfd_open(fd)
        alloc.release_shm_allocation(ptr)
    assert caplog.messages == []
    line = mapping_of(ptr)
    assert line is None or "/memfd:umbp_host_buffer" not in line
    assert not memfd_open(fd)
    assert alloc.snapshot() == {"live": [], "shm": []}

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        alloc.release_shm_allocation(ptr)
    assert caplog.messages == [
        f"ReleaseShmAllocation({ptr:#x}): no shm allocation is based there; ignored"
    ]


def test_release_before_free_keeps_buffer(alloc, caplog):
    h = alloc.alloc(PAGE, AnonymousShm)
    assert alloc.acquire_shm_allocation(h.ptr, PAGE) is not None
    alloc.release_shm_allocation(h.ptr)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        alloc.release_shm_allocation(h.ptr)
    assert caplog.messages == [
        f"ReleaseShmAllocation({h.ptr:#x}) without a matching AcquireShmAllocation; ignored"
    ]
    assert alloc.snapshot()["shm"][0]["active_registrations"] == 0
    ptr, fd = h.ptr, h.fd
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        alloc.free(h)  # no registration: unmapped at once
    assert caplog.messages == []
    line = mapping_of(ptr)
    assert line is None or "/memfd:umbp_host_buffer" not in line
    assert not memfd_open(fd)
