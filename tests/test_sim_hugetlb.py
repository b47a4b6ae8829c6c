"""SimKernel hugetlb mmap, faults, munmap (docs/kernel-model.md sections 1, 2, 4) via raw calls."""

from __future__ import annotations

import errno

import pytest

from umbp_sim import _native
from umbp_sim.machine import GiB, Machine, MiB
from umbp_sim.sim import HugePages, SimHost

C = _native.constants
RW = C["PROT_READ"] | C["PROT_WRITE"]
PRIV = C["MAP_PRIVATE"] | C["MAP_ANONYMOUS"]
HUGE = PRIV | C["MAP_HUGETLB"]
NORES = HUGE | C["MAP_NORESERVE"]
HUGE_1G = HUGE | (30 << C["MAP_HUGE_SHIFT"])
POP_W = C["MADV_POPULATE_WRITE"]
H2 = 2 * MiB


def host(**kw: object) -> SimHost:
    kw.setdefault("hugepages", {"2MiB": 4})
    return SimHost(Machine.x86_64(**kw))  # type: ignore[arg-type]


def counters(h: SimHost) -> tuple[int, int, int, int]:
    m = h.meminfo()
    return (m["HugePages_Total"], m["HugePages_Free"], m["HugePages_Rsvd"], m["HugePages_Surp"])


def test_reservation_experiment_of_section_1() -> None:
    h = host()
    k = h.kernel
    a = k.mmap(0, 3 * H2, RW, HUGE)
    assert a.ok and a.value % H2 == 0
    assert counters(h) == (4, 4, 3, 0)
    assert k.mmap(0, 2 * H2, RW, HUGE).error == errno.ENOMEM
    b = k.mmap(0, 1, RW, HUGE)
    assert b.ok and counters(h) == (4, 4, 4, 0)
    assert [m.length for m in h.mappings() if m.start == b.value] == [H2]
    assert k.mmap(0, H2, RW, HUGE).error == errno.ENOMEM
    n = k.mmap(0, 2 * H2, RW, NORES)
    assert n.ok and counters(h) == (4, 4, 4, 0)
    assert k.touch(a.value, 1, 4096).ok
    assert counters(h) == (4, 3, 3, 0)
    assert k.touch(a.value + H2, 1, 4096).ok
    assert counters(h) == (4, 2, 2, 0)
    r = k.touch(n.value, 1, 4096)
    assert r.signal == 7  # SIGBUS: every free page is reserved
    info = k.crash_info()
    assert info["signal"] == "SIGBUS" and info["where"] == "prefault touch"
    assert info["node"] == 0 and info["hugepage_size"] == H2
    assert h.crash is not None and h.crash.signal == "SIGBUS"
    # The simulated process is dead: every later call says so.
    assert k.munmap(a.value, 3 * H2).signal == 7
    assert k.mmap(0, 4096, RW, PRIV).signal == 7


def test_unsupported_size_is_einval_empty_pool_is_enomem() -> None:
    h = host()
    assert h.kernel.mmap(0, H2, RW, HUGE | (24 << C["MAP_HUGE_SHIFT"])).error == errno.EINVAL
    assert h.kernel.mmap(0, H2, RW, HUGE | (16 << C["MAP_HUGE_SHIFT"])).error == errno.EINVAL
    assert h.kernel.mmap(0, GiB, RW, HUGE_1G).error == errno.ENOMEM
    assert h.kernel.mmap(0, 0, RW, HUGE).error == errno.EINVAL


def test_no_hugetlb_kernel_is_einval() -> None:
    h = SimHost(Machine.build(hugepage_sizes=[], default_hugepage_size=None))
    assert h.kernel.mmap(0, H2, RW, HUGE).error == errno.EINVAL
    assert "HugePages_Total" not in h.meminfo()


def test_noreserve_1g_maps_aligned_then_sigbus() -> None:
    h = host()
    r = h.kernel.mmap(0, GiB, RW, NORES | (30 << C["MAP_HUGE_SHIFT"]))
    assert r.ok and r.value % GiB == 0
    assert h.kernel.touch(r.value, 4096, 4096).signal == 7
    assert h.crash.hugepage_size == GiB


def test_hint_moves_up_and_fixed_unaligned_is_einval() -> None:
    h = host()
    r = h.kernel.mmap(0x7F0000001000, H2, RW, HUGE)
    assert r.ok and r.value % H2 == 0
    assert h.kernel.mmap(0x7F0000001000, H2, RW, HUGE | C["MAP_FIXED"]).error == errno.EINVAL


def test_real_memory_is_writable() -> None:
    import ctypes

    h = host()
    r = h.kernel.mmap(0, H2, RW, HUGE)
    ctypes.memset(r.value, 0x5A, 4096)
    assert ctypes.string_at(r.value, 4) == b"ZZZZ"
    assert h.kernel.munmap(r.value, H2).ok


def test_surplus_at_mmap_within_overcommit() -> None:
    h = host(nr_overcommit_hugepages={"2MiB": 2})
    k = h.kernel
    a = k.mmap(0, 5 * H2, RW, HUGE)
    assert a.ok and counters(h) == (5, 5, 5, 1)
    assert k.mmap(0, 2 * H2, RW, HUGE).error == errno.ENOMEM  # would need 2 more, 1 allowed
    assert counters(h) == (5, 5, 5, 1)
    assert k.munmap(a.value, 5 * H2).ok
    assert counters(h) == (4, 4, 0, 0)


def test_surplus_at_fault_for_noreserve() -> None:
    h = host(hugepages={"2MiB": 1}, nr_overcommit_hugepages={"2MiB": 1})
    k = h.kernel
    n = k.mmap(0, 3 * H2, RW, NORES)
    assert k.madvise(n.value, 3 * H2, POP_W).error == errno.EFAULT
    assert counters(h) == (2, 0, 0, 1)
    assert k.munmap(n.value, 3 * H2).ok
    assert counters(h) == (1, 1, 0, 0)


def test_lowering_nr_hugepages_makes_in_use_pages_surplus() -> None:
    h = host()
    k = h.kernel
    a = k.mmap(0, 3 * H2, RW, HUGE)
    assert k.touch(a.value, 2 * H2, H2).ok
    h.set_nr_hugepages(H2, 1)
    assert counters(h) == (3, 1, 1, 2)
    assert h.read("/proc/sys/vm/nr_hugepages") == "1\n"
    assert h.read("/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages") == "3\n"
    node = "/sys/devices/system/node/node0/hugepages/hugepages-2048kB/"
    assert [h.read(node + f) for f in ("nr_hugepages", "free_hugepages", "surplus_hugepages")] == [
        "3\n",
        "1\n",
        "2\n",
    ]
    assert k.munmap(a.value, 3 * H2).ok
    assert counters(h) == (1, 1, 0, 0)


def test_populate_on_bound_node_without_pages_efault_keeps_earlier_pages() -> None:
    h = SimHost(Machine.build(nodes=2, hugepages_per_node=[{"2MiB": 4}, {"2MiB": 2}]))
    k = h.kernel
    a = k.mmap(0, 4 * H2, RW, HUGE)
    assert k.mbind(a.value, 4 * H2, C["MPOL_BIND"], [1], 64).ok
    assert k.madvise(a.value, 4 * H2, POP_W).error == errno.EFAULT
    assert h.node_hugepages(1) == HugePages(2, 0, 0, 0)
    assert h.node_hugepages(0) == HugePages(4, 4, 0, 0)
    assert h.hugepages() == HugePages(6, 4, 2, 0)  # global Rsvd covered it, the node did not
    assert h.mappings()[0].faulted_pages == 2
    assert h.crash is None
    assert k.touch(a.value, 4 * H2, H2).signal == 7
    assert h.crash.node == 1


def test_populate_read_uses_a_page_and_sub_page_range_populates_whole_page() -> None:
    h = host()
    a = h.kernel.mmap(0, 2 * H2, RW, HUGE)
    assert h.kernel.madvise(a.value, 4096, C["MADV_POPULATE_READ"]).ok
    assert counters(h) == (4, 3, 1, 0)


def test_populate_read_of_private_anonymous_memory_maps_the_zero_page() -> None:
    """Nothing is allocated until a write; shared anonymous memory (shmem) allocates on the
    read (measured: docs/kernel-model.md section 4)."""
    h = SimHost(Machine.build(nodes=1, mem_per_node="16GiB"))
    k = h.kernel
    private = k.mmap(0, 64 * MiB, RW, C["MAP_PRIVATE"] | C["MAP_ANONYMOUS"]).value
    shared = k.mmap(0, 64 * MiB, RW, C["MAP_SHARED"] | C["MAP_ANONYMOUS"]).value
    free = h.meminfo()["MemFree"]
    assert k.madvise(private, 64 * MiB, C["MADV_POPULATE_READ"]).ok
    assert h.meminfo()["MemFree"] == free
    assert [m.faulted_pages for m in h.mappings() if m.start == private] == [0]
    assert k.madvise(private, 64 * MiB, POP_W).ok  # the write allocates
    assert h.meminfo()["MemFree"] == free - 64 * 1024
    assert k.madvise(shared, 64 * MiB, C["MADV_POPULATE_READ"]).ok
    assert h.meminfo()["MemFree"] == free - 2 * 64 * 1024
    ro = k.mmap(0, 4 * MiB, C["PROT_READ"], C["MAP_PRIVATE"] | C["MAP_ANONYMOUS"])
    assert ro.ok and k.madvise(ro.value, 4 * MiB, C["MADV_POPULATE_READ"]).ok
    assert h.meminfo()["MemFree"] == free - 2 * 64 * 1024


def test_populate_errors() -> None:
    h = host()
    k = h.kernel
    ro = k.mmap(0, H2, C["PROT_READ"], HUGE)
    assert k.madvise(ro.value, H2, POP_W).error == errno.EINVAL
    assert k.madvise(ro.value + 1, H2, POP_W).error == errno.EINVAL
    assert k.munmap(ro.value, H2).ok
    assert k.madvise(ro.value, H2, POP_W).error == errno.ENOMEM
    assert k.madvise(0, 0, POP_W).ok
    assert k.madvise(0, 0, 999).error == errno.EINVAL


@pytest.mark.parametrize(
    "off,length", [(4096, H2), (H2, 4096), (0, H2 + 4096), (0, 3 * H2 - 4096), (0, 1)]
)
def test_munmap_inside_a_hugepage_is_einval(off: int, length: int) -> None:
    h = host()
    a = h.kernel.mmap(0, 3 * H2, RW, HUGE)
    assert h.kernel.munmap(a.value + off, length).error == errno.EINVAL
    assert counters(h) == (4, 4, 3, 0)


def test_munmap_past_the_end_and_private_release() -> None:
    h = host()
    k = h.kernel
    a = k.mmap(0, 3 * H2, RW, HUGE)
    assert k.touch(a.value, H2, H2).ok
    assert counters(h) == (4, 3, 2, 0)
    assert k.munmap(a.value + H2, 2 * H2 + 64 * 1024).ok  # end in unmapped space: fine
    assert counters(h) == (4, 3, 0, 0)
    assert k.munmap(a.value, H2).ok
    assert counters(h) == (4, 4, 0, 0)
    assert h.mappings() == []


def test_dontneed_restores_reservation_on_new_kernels_only() -> None:
    for version, expect in (("6.18.0", (4, 4, 2, 0)), ("6.1.0", (4, 4, 1, 0))):
        h = host(kernel_version=version)
        a = h.kernel.mmap(0, 2 * H2, RW, HUGE)
        assert h.kernel.touch(a.value, H2, H2).ok
        assert h.kernel.madvise(a.value, 4096, C["MADV_DONTNEED"]).ok
        assert counters(h) == (4, 3, 1, 0)  # valid, but no whole hugepage in the range
        assert h.kernel.madvise(a.value, H2, C["MADV_DONTNEED"]).ok
        assert counters(h) == expect
    old = host(kernel_version="5.15.0")
    a = old.kernel.mmap(0, H2, RW, HUGE)
    assert old.kernel.madvise(a.value, H2, C["MADV_DONTNEED"]).error == errno.EINVAL


def test_task_bind_policy_checked_at_mmap_since_5_9() -> None:
    for version, expect in (("6.18.0", errno.ENOMEM), ("5.4.0", 0)):
        m = Machine.build(
            nodes=2, hugepages_per_node=[{"2MiB": 4}, {"2MiB": 1}], kernel_version=version
        )
        h = SimHost(m)
        h.kernel.set_task_policy(C["MPOL_BIND"], [1])
        r = h.kernel.mmap(0, 2 * H2, RW, HUGE)
        assert r.error == expect
        assert h.hugepages().reserved == (2 if expect == 0 else 0)


def test_huge_mapping_costs_counters_not_memory() -> None:
    m = Machine.x86_64(mem_per_node="4TiB", hugepages={"1GiB": 4000})
    h = SimHost(m)
    k = h.kernel
    a = k.mmap(0, 3900 * GiB, RW, HUGE_1G)
    assert a.ok
    assert k.madvise(a.value, 3900 * GiB, POP_W).ok
    assert h.hugepages(GiB) == HugePages(4000, 100, 0, 0)
    assert k.munmap(a.value, 3900 * GiB).ok
    assert h.hugepages(GiB) == HugePages(4000, 4000, 0, 0)


def test_dontneed_does_not_restore_while_surplus_exists() -> None:
    h = host(hugepages={"2MiB": 1}, nr_overcommit_hugepages={"2MiB": 1})
    k = h.kernel
    a = k.mmap(0, 2 * H2, RW, HUGE).value
    assert counters(h) == (2, 2, 2, 1)
    assert k.madvise(a, H2, POP_W).ok
    assert counters(h) == (2, 1, 1, 1)
    assert k.madvise(a, H2, C["MADV_DONTNEED"]).ok  # surplus page dissolved, no restore
    assert counters(h) == (1, 1, 1, 0)
    assert h.mappings()[0].reserved_pages == 1
