"""Hugetlb on the real kernel: demotion texts with the requested size's counters, and real
hugepages with HugePages_Total/Free/Rsvd checked after every step (pools set by the test)."""

from __future__ import annotations

import ctypes
import logging
import os

import pytest
from conftest import hugepage_counters, mapping_of, meminfo_hugepages

from umbp_sim import (
    Anonymous,
    AnonymousHugetlb,
    AnonymousShm,
    AnonymousShmHugetlb,
    UMBPHostMemAllocator,
    _native,
)

PAGE = os.sysconf("SC_PAGESIZE")
MiB = 1 << 20
GiB = 1 << 30
LOGGER = "umbp_sim.allocator"


def pool(total: int, free: int, rsvd: int) -> dict[str, int]:
    return {"HugePages_Total": total, "HugePages_Free": free, "HugePages_Rsvd": rsvd,
            "HugePages_Surp": 0}  # fmt: skip


def poke(ptr: int, offset: int) -> None:
    ctypes.c_uint8.from_address(ptr + offset).value = 0x42


@pytest.mark.parametrize(
    ("backing", "fallback"), [(AnonymousHugetlb, Anonymous), (AnonymousShmHugetlb, AnonymousShm)]
)
def test_empty_pool_demotes_with_counters(nr_hugepages, caplog, backing, fallback):
    assert nr_hugepages(0) == 0
    kernel = _native.LinuxKernel()
    a = UMBPHostMemAllocator(kernel=kernel)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        h = a.alloc(3 * MiB, backing)
    assert h.actual_backing == fallback
    assert (h.mapped_size, h.actual_alignment) == (3 * MiB, PAGE)
    assert caplog.messages == [
        "hugetlb mmap of 4194304 bytes (2048 kB pages) failed: ENOMEM; HugePages of 2048 kB: "
        f"free 0, total 0, reserved 0; falling back to 4 KiB pages ({fallback.name})"
    ]
    poke(h.ptr, 0)
    poke(h.ptr, 3 * MiB - 1)
    assert (fallback == AnonymousShm) == (a.lookup_shm_allocation(h.ptr, 1) is not None)
    # once per kernel and reason
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        h2 = a.alloc(3 * MiB, backing)
    assert caplog.messages == []
    assert h2.actual_backing == fallback
    other = UMBPHostMemAllocator(kernel=_native.LinuxKernel())
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        h3 = other.alloc(3 * MiB, backing)  # another machine shows its own warning
    assert len(caplog.messages) == 1
    for handle in (h, h2):
        a.free(handle)
    other.free(h3)
    assert a.snapshot() == other.snapshot() == {"live": [], "shm": []}


@pytest.mark.parametrize("prefault", [False, True])
def test_real_hugetlb_counters(nr_hugepages, linux_kernel, caplog, prefault):
    assert nr_hugepages(8) == 8
    assert meminfo_hugepages() == pool(8, 8, 0)
    a = UMBPHostMemAllocator(kernel=linux_kernel)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        h = a.alloc(3 * MiB, AnonymousHugetlb, prefault=prefault)
    assert caplog.messages == []
    assert h.actual_backing == AnonymousHugetlb
    assert (h.requested_size, h.mapped_size, h.actual_alignment) == (3 * MiB, 4 * MiB, 2 * MiB)
    assert h.ptr % (2 * MiB) == 0
    assert "anon_hugepage" in mapping_of(h.ptr)
    if prefault:
        assert meminfo_hugepages() == pool(8, 6, 0)
    else:
        assert meminfo_hugepages() == pool(8, 8, 2)  # reserved at mmap, not faulted
        poke(h.ptr, 0)
        assert meminfo_hugepages() == pool(8, 7, 1)
        poke(h.ptr, 3 * MiB - 1)
        assert meminfo_hugepages() == pool(8, 6, 0)
    a.free(h)
    assert not h
    assert meminfo_hugepages() == pool(8, 8, 0)
    assert hugepage_counters(2048) == {"total": 8, "free": 8, "reserved": 0, "surplus": 0}


def test_real_shm_hugetlb_counters(nr_hugepages, linux_kernel, caplog):
    assert nr_hugepages(8) == 8
    a = UMBPHostMemAllocator(kernel=linux_kernel)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        h = a.alloc(3 * MiB, AnonymousShmHugetlb, prefault=False)
    assert caplog.messages == []
    assert h.actual_backing == AnonymousShmHugetlb
    assert (h.mapped_size, h.actual_alignment) == (4 * MiB, 2 * MiB)
    assert h.ptr % (2 * MiB) == 0
    assert os.fstat(h.fd).st_blksize == 2 * MiB
    assert "/memfd:umbp_host_buffer_hugetlb" in mapping_of(h.ptr)
    assert meminfo_hugepages() == pool(8, 8, 2)
    shm = a.acquire_shm_allocation(h.ptr + 2 * MiB, 4096)
    assert (shm.base, shm.mapped_size, shm.fd) == (h.ptr, 4 * MiB, h.fd)
    poke(h.ptr, 0)
    assert meminfo_hugepages() == pool(8, 7, 1)
    a.free(h)  # deferred: the registration holds the pages
    assert meminfo_hugepages() == pool(8, 7, 1)
    a.release_shm_allocation(shm.base)
    assert meminfo_hugepages() == pool(8, 8, 0)
    h = a.alloc(4 * MiB, AnonymousShmHugetlb)  # prefaulted
    assert meminfo_hugepages() == pool(8, 6, 0)
    a.free(h)
    assert meminfo_hugepages() == pool(8, 8, 0)


def test_pool_too_small_names_its_counters(nr_hugepages, linux_kernel, caplog):
    assert nr_hugepages(1) == 1
    a = UMBPHostMemAllocator(kernel=linux_kernel)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        h = a.alloc(4 * MiB, AnonymousHugetlb)
    assert h.actual_backing == Anonymous
    assert caplog.messages == [
        "hugetlb mmap of 4194304 bytes (2048 kB pages) failed: ENOMEM; HugePages of 2048 kB: "
        "free 1, total 1, reserved 0; falling back to 4 KiB pages (Anonymous)"
    ]
    a.free(h)
    assert meminfo_hugepages() == pool(1, 1, 0)


def test_1gib_request_with_empty_1gib_pool_demotes(nr_hugepages, linux_kernel, caplog):
    # The default (2 MiB) pool is not empty, so counters of the wrong size would show.
    assert nr_hugepages(2) == 2
    assert nr_hugepages(0, size_kb=1048576) == 0
    a = UMBPHostMemAllocator(kernel=linux_kernel)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        h = a.alloc(GiB, AnonymousHugetlb, hugepage_size=GiB, prefault=False)
    assert h.actual_backing == Anonymous
    assert (h.mapped_size, h.actual_alignment) == (GiB, PAGE)
    assert caplog.messages == [
        "hugetlb mmap of 1073741824 bytes (1048576 kB pages) failed: ENOMEM; HugePages of "
        "1048576 kB: free 0, total 0, reserved 0; falling back to 4 KiB pages (Anonymous)"
    ]
    a.free(h)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        h = a.alloc(GiB, AnonymousShmHugetlb, hugepage_size=GiB, prefault=False)
    assert h.actual_backing == AnonymousShm
    assert caplog.messages == [
        "hugetlb mmap of 1073741824 bytes (1048576 kB pages) failed: ENOMEM; HugePages of "
        "1048576 kB: free 0, total 0, reserved 0; falling back to 4 KiB pages (AnonymousShm)"
    ]
    a.free(h)


def test_size_not_configured_on_this_kernel(linux_kernel, caplog):
    a = UMBPHostMemAllocator(kernel=linux_kernel)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        h1 = a.alloc(MiB, AnonymousHugetlb, hugepage_size=16 * MiB)
        h2 = a.alloc(MiB, AnonymousShmHugetlb, hugepage_size=16 * MiB)
    assert (h1.actual_backing, h2.actual_backing) == (Anonymous, AnonymousShm)
    assert caplog.messages == [
        "hugetlb mmap of 16777216 bytes (16384 kB pages) failed: EINVAL; HugePages of 16384 kB: "
        "not configured on this kernel; falling back to 4 KiB pages (Anonymous)",
        "hugetlb memfd_create (16384 kB pages) failed: ENODEV; HugePages of 16384 kB: "
        "not configured on this kernel; falling back to 4 KiB pages (AnonymousShm)",
    ]
    a.free(h1)
    a.free(h2)


@pytest.mark.parametrize(
    ("hugepage_size", "text"),
    [
        (3 * MiB, "hugepage_size 3145728 is not a power of two"),
        (0, "hugepage_size 0 is not a power of two"),
        (
            4096,
            "hugepage_size 4096 cannot be encoded in MAP_HUGE_* (not larger than the 4 KiB base "
            "page)",
        ),
        (
            1,
            "hugepage_size 1 cannot be encoded in MAP_HUGE_* (not larger than the 4 KiB base page)",
        ),
    ],
)
@pytest.mark.parametrize(
    ("backing", "fallback"), [(AnonymousHugetlb, Anonymous), (AnonymousShmHugetlb, AnonymousShm)]
)
def test_unusable_hugepage_size_demotes(linux_kernel, caplog, hugepage_size, text, backing,
                                        fallback):  # fmt: skip
    a = UMBPHostMemAllocator(kernel=linux_kernel)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        h = a.alloc(5000, backing, hugepage_size=hugepage_size)
    assert h.actual_backing == fallback
    assert (h.mapped_size, h.actual_alignment) == (2 * PAGE, PAGE)
    assert caplog.messages == [f"{text}; falling back to 4 KiB pages ({fallback.name})"]
    a.free(h)


def test_16gib_size_bits_reach_the_kernel(linux_kernel, caplog):
    # log2(16 GiB) = 34: the size field sets bit 31 of the flags (as MAP_HUGE_16GB does). x86
    # has no such size, so the kernel answers EINVAL / ENODEV, not a mangled flag error.
    a = UMBPHostMemAllocator(kernel=linux_kernel)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        h1 = a.alloc(100, AnonymousHugetlb, hugepage_size=16 * GiB, prefault=False)
        h2 = a.alloc(100, AnonymousShmHugetlb, hugepage_size=16 * GiB, prefault=False)
    assert (h1.actual_backing, h2.actual_backing) == (Anonymous, AnonymousShm)
    assert caplog.messages == [
        "hugetlb mmap of 17179869184 bytes (16777216 kB pages) failed: EINVAL; HugePages of "
        "16777216 kB: not configured on this kernel; falling back to 4 KiB pages (Anonymous)",
        "hugetlb memfd_create (16777216 kB pages) failed: ENODEV; HugePages of 16777216 kB: "
        "not configured on this kernel; falling back to 4 KiB pages (AnonymousShm)",
    ]
    a.free(h1)
    a.free(h2)
