"""UMBPHostMemAllocator on the real kernel: round trips, sizes, free, the mori surface."""

from __future__ import annotations

import ctypes
import logging
import os

import pytest
from conftest import mapping_of

import umbp_sim
import umbp_sim.allocator as allocator_module
from umbp_sim import (
    Anonymous,
    AnonymousHugetlb,
    AnonymousShm,
    AnonymousShmHugetlb,
    SimulatedCrash,
    UMBPHostBufferBacking,
    UMBPHostBufferHandle,
    UMBPHostMemAllocator,
    _native,
)

PAGE = os.sysconf("SC_PAGESIZE")
LOGGER = "umbp_sim.allocator"


def fd_is_our_memfd(fd: int) -> bool:
    # fd numbers are reused within the process: ask what the number points at now.
    try:
        return os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:umbp_host_buffer")
    except FileNotFoundError:
        return False


def write_read(ptr: int, offset: int, value: int) -> int:
    ctypes.c_uint8.from_address(ptr + offset).value = value
    return ctypes.c_uint8.from_address(ptr + offset).value


@pytest.mark.parametrize("backing", [Anonymous, AnonymousShm])
@pytest.mark.parametrize("size", [1, PAGE, PAGE + 1, 3 * PAGE - 1, 1 << 20])
def test_round_trip_base_pages(linux_kernel, backing, size):
    a = UMBPHostMemAllocator(kernel=linux_kernel)
    h = a.alloc(size, backing)
    assert h
    assert h.actual_backing == backing
    assert h.requested_size == size
    assert h.mapped_size == -(-size // PAGE) * PAGE
    assert h.actual_alignment == PAGE
    assert h.ptr % PAGE == 0
    assert h.numa_node == -1
    assert write_read(h.ptr, 0, 0xA5) == 0xA5
    assert write_read(h.ptr, size - 1, 0x5A) == 0x5A
    line = mapping_of(h.ptr)
    assert line is not None and "rw" in line.split()[1]
    if backing == AnonymousShm:
        assert h.fd >= 0 and os.fstat(h.fd).st_size == h.mapped_size
        assert "/memfd:umbp_host_buffer" in line
        assert line.split()[1] == "rw-s"
    else:
        assert h.fd == -1
        assert line.split()[1] == "rw-p"
    ptr, fd = h.ptr, h.fd
    a.free(h)
    assert not h
    assert (h.ptr, h.requested_size, h.mapped_size, h.fd) == (0, 0, 0, -1)
    assert mapping_of(ptr) is None or "/memfd:umbp_host_buffer" not in mapping_of(ptr)
    if fd >= 0:
        assert not fd_is_our_memfd(fd)
    assert a.snapshot() == {"live": [], "shm": []}


def test_mori_surface():
    assert str(UMBPHostBufferBacking.AnonymousHugetlb) == "UMBPHostBufferBacking.AnonymousHugetlb"
    assert [m.name for m in (Anonymous, AnonymousHugetlb, AnonymousShm, AnonymousShmHugetlb)] == [
        "Anonymous",
        "AnonymousHugetlb",
        "AnonymousShm",
        "AnonymousShmHugetlb",
    ]
    assert umbp_sim.AnonymousShmHugetlb is UMBPHostBufferBacking.AnonymousShmHugetlb
    assert isinstance(umbp_sim.__version__, str) and umbp_sim.__version__
    empty = UMBPHostBufferHandle()
    assert not empty
    assert repr(empty) == "<UMBPHostBufferHandle ptr=0x0 requested_size=0 mapped_size=0>"
    a = UMBPHostMemAllocator()
    h = a.alloc(5000)
    assert repr(h) == f"<UMBPHostBufferHandle ptr={h.ptr:#x} requested_size=5000 mapped_size=8192>"
    assert h.ptr != 0 and h.ptr % 4096 == 0  # a real mapping (where mmap puts it varies)
    a.free(h)
    # mori's positional order: size, backing, hugepage_size, numa_node, prefault
    h = a.alloc(4096, Anonymous, 2097152, -1, False)
    assert h.mapped_size == 4096
    a.free(h)


def test_default_kernel_is_the_process_wide_linux_kernel():
    a, b = UMBPHostMemAllocator(), UMBPHostMemAllocator()
    assert a.kernel is b.kernel
    assert isinstance(a.kernel, _native.LinuxKernel)


ALL = [Anonymous, AnonymousHugetlb, AnonymousShm, AnonymousShmHugetlb]


@pytest.mark.parametrize("size", [0, 2**64 - 1, 2**64 - PAGE + 1])
@pytest.mark.parametrize("backing", ALL)
def test_unallocatable_sizes_give_invalid_handle(linux_kernel, caplog, size, backing):
    a = UMBPHostMemAllocator(kernel=linux_kernel)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        h = a.alloc(size, backing)
    assert not h
    assert (h.ptr, h.requested_size, h.mapped_size) == (0, 0, 0)
    if size == 0:
        assert caplog.messages == [
            "Alloc(size=0): nothing to allocate; returning an invalid handle"
        ]
    else:
        pages = "2048 kB" if backing in (AnonymousHugetlb, AnonymousShmHugetlb) else "4 KiB"
        assert caplog.messages == [
            f"Alloc(size={size}): rounding up to {pages} pages overflows; "
            "returning an invalid handle"
        ]
    a.free(h)  # freeing an invalid handle is a no-op
    assert a.snapshot() == {"live": [], "shm": []}


def test_huge_but_representable_size_fails_cleanly(linux_kernel, caplog):
    a = UMBPHostMemAllocator(kernel=linux_kernel)
    size = 2**64 - 2 * PAGE  # rounds fine, no kernel can map it
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        h = a.alloc(size, Anonymous, prefault=False)
    assert not h
    assert caplog.messages == [
        f"mmap of {size} bytes (Anonymous, 4 KiB pages) failed: ENOMEM; returning an invalid handle"
    ]


def test_double_free_is_a_noop(linux_kernel, caplog):
    a = UMBPHostMemAllocator(kernel=linux_kernel)
    h = a.alloc(PAGE)
    ptr = h.ptr
    a.free(h)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        a.free(h)
        a.free(h)
    assert caplog.messages == []
    # A new buffer at the same address is not touched by the stale handle.
    h2 = a.alloc(PAGE)
    a.free(h)
    assert mapping_of(h2.ptr) is not None
    assert write_read(h2.ptr, 0, 7) == 7
    a.free(h2)
    del ptr


def test_allocators_on_one_kernel_share_buffers(linux_kernel, caplog):
    a = UMBPHostMemAllocator(kernel=linux_kernel)
    b = UMBPHostMemAllocator(kernel=linux_kernel)
    other = UMBPHostMemAllocator(kernel=_native.LinuxKernel())
    h = a.alloc(PAGE, AnonymousShm)
    assert b.lookup_shm_allocation(h.ptr, 1).base == h.ptr
    assert other.lookup_shm_allocation(h.ptr, 1) is None
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        other.free(h)
    assert caplog.messages == [
        f"Free of {h.ptr:#x}, which no allocator on this kernel owns (freed through a copy of "
        "its handle, or allocated on another kernel); nothing unmapped, handle unchanged"
    ]
    assert h and mapping_of(h.ptr) is not None
    b.free(h)
    assert not h
    assert a.snapshot() == {"live": [], "shm": []}


def test_snapshot_lists_live_buffers(linux_kernel):
    a = UMBPHostMemAllocator(kernel=linux_kernel)
    h1 = a.alloc(100)
    h2 = a.alloc(PAGE + 1, AnonymousShm, prefault=False)
    snap = a.snapshot()
    live = sorted(snap["live"], key=lambda b: b["ptr"] == h2.ptr)
    assert live == [
        {
            "ptr": h1.ptr,
            "requested_size": 100,
            "mapped_size": PAGE,
            "backing": Anonymous,
            "alignment": PAGE,
            "fd": -1,
            "numa_node": -1,
        },
        {
            "ptr": h2.ptr,
            "requested_size": PAGE + 1,
            "mapped_size": 2 * PAGE,
            "backing": AnonymousShm,
            "alignment": PAGE,
            "fd": h2.fd,
            "numa_node": -1,
        },
    ]
    assert snap["shm"] == [
        {
            "base": h2.ptr,
            "mapped_size": 2 * PAGE,
            "fd": h2.fd,
            "active_registrations": 0,
            "pending_free": False,
        }
    ]
    a.free(h1)
    a.free(h2)
    assert a.snapshot() == {"live": [], "shm": []}


BAD_ARGS = [
    ({"size": -1}, ValueError, "size must not be negative, got -1"),
    ({"size": True}, TypeError, "size must be an int, got bool True"),
    ({"size": 1.5}, TypeError, "size must be an int, got float 1.5"),
    ({"size": "4096"}, TypeError, "size must be an int, got str '4096'"),
    ({"size": 2**64}, ValueError, "size is out of range"),
    ({"size": 1, "backing": 1}, TypeError, "backing must be a UMBPHostBufferBacking, got int 1"),
    ({"size": 1, "backing": "Anonymous"}, TypeError, "backing must be a UMBPHostBufferBacking"),
    ({"size": 1, "hugepage_size": -2}, ValueError, "hugepage_size must not be negative, got -2"),
    ({"size": 1, "hugepage_size": False}, TypeError, "hugepage_size must be an int, got bool"),
    ({"size": 1, "numa_node": True}, TypeError, "numa_node must be an int, got bool True"),
    ({"size": 1, "numa_node": "0"}, TypeError, "numa_node must be an int, got str '0'"),
    ({"size": 1, "numa_node": 2**31}, ValueError, "numa_node is out of range"),
    ({"size": 1, "prefault": "yes"}, TypeError, "prefault must be a bool, got str 'yes'"),
    ({"size": 1, "prefault": 2}, TypeError, "prefault must be a bool, got int 2"),
]


@pytest.mark.parametrize(("kwargs", "exc", "text"), BAD_ARGS)
def test_wrong_arguments_name_the_argument(linux_kernel, kwargs, exc, text):
    a = UMBPHostMemAllocator(kernel=linux_kernel)
    with pytest.raises(exc, match="^" + text.replace("(", r"\(").replace(".", r"\.")):
        a.alloc(**kwargs)
    assert a.snapshot() == {"live": [], "shm": []}


def test_wrong_arguments_elsewhere(linux_kernel):
    a = UMBPHostMemAllocator(kernel=linux_kernel)
    with pytest.raises(TypeError, match="^handle must be a UMBPHostBufferHandle, got int 5"):
        a.free(5)
    with pytest.raises(TypeError, match="^handle must be a UMBPHostBufferHandle, got NoneType"):
        a.free(None)
    with pytest.raises(TypeError, match="^kernel must be a umbp_sim._native.Kernel or None"):
        UMBPHostMemAllocator(kernel="linux")
    with pytest.raises(ValueError, match="^ptr must not be negative"):
        a.lookup_shm_allocation(-1, 1)
    with pytest.raises(TypeError, match="^size must be an int"):
        a.acquire_shm_allocation(4096, None)
    with pytest.raises(TypeError, match="^base must be an int"):
        a.release_shm_allocation(1.0)


def test_numpy_style_integers_are_accepted(linux_kernel):
    class Index:
        def __index__(self) -> int:
            return 4096

    a = UMBPHostMemAllocator(kernel=linux_kernel)
    h = a.alloc(Index(), hugepage_size=Index())
    assert h.mapped_size == 4096
    a.free(h)


def test_simulated_signal_raises_simulated_crash(linux_kernel):
    class CrashReportingKernel(_native.LinuxKernel):
        def crash_info(self):
            return {
                "signal": "SIGBUS",
                "where": "prefault touch",
                "node": 1,
                "hugepage_size": 2097152,
                "detail": "no free 2048 kB page on node 1",
            }

    # LinuxKernel never reports a signal: drive the outcome hook directly.
    a = UMBPHostMemAllocator(kernel=linux_kernel)
    with pytest.raises(SimulatedCrash) as e:
        allocator_module._report(a._native, [], 7, "madvise(MADV_POPULATE_WRITE)")
    assert (e.value.signal, e.value.where, e.value.node) == (
        "SIGBUS",
        "madvise(MADV_POPULATE_WRITE)",
        None,
    )
    b = UMBPHostMemAllocator(kernel=CrashReportingKernel())
    with pytest.raises(SimulatedCrash) as e:
        allocator_module._report(b._native, [("warning", "size-zero", "w")], 9, "mmap")
    assert str(e.value) == (
        "killed by SIGBUS during prefault touch of node 1 (2048 kB pages): "
        "no free 2048 kB page on node 1"
    )
