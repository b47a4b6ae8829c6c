"""SimKernel memfd_create / ftruncate / close and shared hugetlb reservations (section 5)."""

from __future__ import annotations

import errno

from umbp_sim import _native
from umbp_sim.machine import GiB, Machine, MiB
from umbp_sim.sim import HugePages, SimHost

C = _native.constants
RW = C["PROT_READ"] | C["PROT_WRITE"]
SHARED, PRIVATE = C["MAP_SHARED"], C["MAP_PRIVATE"]
HTLB = C["MFD_HUGETLB"]
MFD_1G = HTLB | (30 << C["MFD_HUGE_SHIFT"])
H2 = 2 * MiB


def host(**kw: object) -> SimHost:
    kw.setdefault("hugepages", {"2MiB": 4})
    return SimHost(Machine.x86_64(**kw))  # type: ignore[arg-type]


def test_fds_are_private_range_and_close_unknown_is_ebadf() -> None:
    h = host()
    fd = h.kernel.memfd_create("kv", HTLB)
    assert fd.ok and fd.value >= 1_000_000
    assert h.open_fds() == [fd.value]
    assert h.kernel.close(fd.value).ok
    assert h.kernel.close(fd.value).error == errno.EBADF
    assert h.kernel.close(3).error == errno.EBADF
    assert h.kernel.ftruncate(3, H2).error == errno.EBADF
    assert h.kernel.mmap(0, H2, RW, SHARED, 3, 0).error == errno.EBADF


def test_flag_and_version_errors() -> None:
    h = host()
    k = h.kernel
    assert k.memfd_create("x", 24 << C["MFD_HUGE_SHIFT"]).error == errno.EINVAL  # no MFD_HUGETLB
    assert k.memfd_create("x", 0x1000).error == errno.EINVAL
    assert k.memfd_create("x", HTLB | (24 << C["MFD_HUGE_SHIFT"])).error == errno.ENODEV
    assert k.memfd_create("x", HTLB | C["MFD_ALLOW_SEALING"]).ok
    assert host(kernel_version="3.16.0").kernel.memfd_create("x", 0).error == errno.ENOSYS
    assert host(kernel_version="4.13.0").kernel.memfd_create("x", HTLB).error == errno.EINVAL
    old = host(kernel_version="4.15.0").kernel
    assert old.memfd_create("x", HTLB | C["MFD_ALLOW_SEALING"]).error == errno.EINVAL
    assert old.memfd_create("x", HTLB).ok


def test_ftruncate_rules_and_empty_1g_pool() -> None:
    h = host()
    k = h.kernel
    fd = k.memfd_create("x", HTLB).value
    assert k.ftruncate(fd, H2 + 1).error == errno.EINVAL
    assert k.ftruncate(fd, 4096).error == errno.EINVAL
    assert k.ftruncate(fd, 2 * H2).ok
    assert h.hugepages() == HugePages(4, 4, 0, 0)  # ftruncate does not reserve
    g = k.memfd_create("g", MFD_1G).value
    assert k.ftruncate(g, GiB).ok
    assert k.mmap(0, GiB, RW, SHARED, g, 0).error == errno.ENOMEM


def test_shared_reservation_belongs_to_the_inode() -> None:
    h = host()
    k = h.kernel
    fd = k.memfd_create("x", HTLB).value
    assert k.ftruncate(fd, 3 * H2).ok
    a = k.mmap(0, 3 * H2, RW, SHARED, fd, 0)
    assert a.ok and h.hugepages() == HugePages(4, 4, 3, 0)
    b = k.mmap(0, 3 * H2, RW, SHARED, fd, 0)
    assert b.ok and h.hugepages().reserved == 3  # nothing new to reserve
    assert k.mmap(0, H2, RW, SHARED, fd, 4096).error == errno.EINVAL  # offset not a hugepage
    assert k.mmap(0, 2 * H2, RW, PRIVATE, fd, 0).error == errno.ENOMEM  # needs its own
    assert k.madvise(a.value, H2, C["MADV_POPULATE_WRITE"]).ok
    assert h.hugepages() == HugePages(4, 3, 2, 0)
    assert k.munmap(a.value, 3 * H2).ok and k.munmap(b.value, 3 * H2).ok
    assert h.hugepages() == HugePages(4, 3, 2, 0)  # data stays in the file
    assert k.ftruncate(fd, 0).ok
    assert h.hugepages() == HugePages(4, 4, 0, 0)


def test_last_close_releases() -> None:
    h = host()
    k = h.kernel
    fd = k.memfd_create("x", HTLB).value
    assert k.ftruncate(fd, 2 * H2).ok
    a = k.mmap(0, 2 * H2, RW, SHARED, fd, 0).value
    assert k.touch(a, H2, H2).ok
    assert k.close(fd).ok
    assert h.hugepages() == HugePages(4, 3, 1, 0)  # still mapped
    assert k.munmap(a, H2).ok
    assert h.hugepages() == HugePages(4, 3, 1, 0)  # partial munmap releases nothing
    assert k.munmap(a + H2, H2).ok
    assert h.hugepages() == HugePages(4, 4, 0, 0)


def test_shared_noreserve_maps_beyond_pool_then_efault() -> None:
    h = host()
    k = h.kernel
    fd = k.memfd_create("x", HTLB).value
    assert k.ftruncate(fd, 8 * H2).ok
    a = k.mmap(0, 8 * H2, RW, SHARED | C["MAP_NORESERVE"], fd, 0)
    assert a.ok and h.hugepages().reserved == 0
    assert k.madvise(a.value, 8 * H2, C["MADV_POPULATE_WRITE"]).error == errno.EFAULT
    assert h.hugepages() == HugePages(4, 0, 0, 0)


def test_the_page_holding_the_end_of_a_memfd_is_the_files() -> None:
    # A size no page divides: the last page is partly the file's and faults as Linux does (the
    # rest of it reads as zeros); only a page wholly past the end is SIGBUS (measured on 6.18:
    # ftruncate(1) / (4095) / (4 MiB + 1), MADV_POPULATE_WRITE and a touch of every page: 0).
    for size in (1, 4095, 4096 + 1):
        h = host()  # a SIGBUS ends the simulated process: a host each
        k = h.kernel
        fd = k.memfd_create("plain", 0).value
        assert k.ftruncate(fd, size).ok
        mapped = (size + 4095) // 4096 * 4096
        a = k.mmap(0, mapped + 4096, RW, SHARED, fd, 0).value
        assert k.madvise(a, mapped, C["MADV_POPULATE_WRITE"]).ok, size
        assert k.touch(a + mapped - 1, 1, 1).ok, size
        assert [m.file_size for m in h.mappings() if m.start == a] == [size]
        assert k.touch(a + mapped, 1, 1).signal == 7, size  # the next page: past the end
        assert "beyond the end" in h.crash.detail


def test_touch_beyond_eof_is_sigbus() -> None:
    h = host()
    k = h.kernel
    fd = k.memfd_create("plain", 0).value
    assert k.ftruncate(fd, 8192).ok
    a = k.mmap(0, 16384, RW, SHARED, fd, 0).value
    assert k.touch(a, 8192, 4096).ok
    assert k.touch(a, 16384, 4096).signal == 7
    assert "beyond the end" in h.crash.detail


def test_close_on_exec_is_the_fds_and_a_mapping_says_it() -> None:
    # MFD_CLOEXEC marks the descriptor, not the file: every open fd of the memfd is listed
    # (the registry's record must name one), and compare's `mapping` class tells a memfd an
    # exec'd program would inherit.
    from umbp_sim.engine.binding import mapping

    h = host()
    k = h.kernel
    kept = k.memfd_create("kept", 0).value
    closed = k.memfd_create("closed", C["MFD_CLOEXEC"]).value
    addrs = {}
    for fd in (kept, closed):
        assert k.ftruncate(fd, 8192).ok
        addrs[fd] = k.mmap(0, 8192, RW, SHARED, fd, 0).value
    by_start = {m.start: m for m in h.mappings()}
    assert (by_start[addrs[kept]].file_fds, by_start[addrs[kept]].file_fds_cloexec) == ((kept,), 0)
    m = by_start[addrs[closed]]
    assert (m.file_fds, m.file_fds_cloexec) == ((closed,), 1)
    assert mapping(k, addrs[kept]).endswith("file size 8192, its fd inherited by exec")
    assert mapping(k, addrs[closed]).endswith("file size 8192, its fd close-on-exec")
    assert k.close(closed).ok  # the mapping holds the file; no fd does any more
    assert mapping(k, addrs[closed]).endswith("file size 8192, no fd open")
    anon = k.mmap(0, 4096, RW, PRIVATE | C["MAP_ANONYMOUS"], -1, 0).value
    assert mapping(k, anon) == "private anonymous rw, 4KiB pages"
