"""SimKernel anonymous memory: overcommit 0/1/2, RLIMIT_AS, memcg and hugetlb cgroup limits,
kernel version gates (docs/kernel-model.md sections 4-6, 9)."""

from __future__ import annotations

import errno

from umbp_sim import _native
from umbp_sim.machine import GiB, Machine, MiB
from umbp_sim.sim import SimHost

C = _native.constants
RW = C["PROT_READ"] | C["PROT_WRITE"]
PRIV = C["MAP_PRIVATE"] | C["MAP_ANONYMOUS"]
SHANON = C["MAP_SHARED"] | C["MAP_ANONYMOUS"]
NORES = C["MAP_NORESERVE"]
HUGE = PRIV | C["MAP_HUGETLB"]
H2 = 2 * MiB


def host(**kw: object) -> SimHost:
    kw.setdefault("mem_per_node", "24GiB")
    return SimHost(Machine.x86_64(**kw))  # type: ignore[arg-type]


def test_mode0_is_a_per_call_heuristic() -> None:
    h = host()
    k = h.kernel
    assert k.mmap(0, 30 * GiB, RW, PRIV).error == errno.ENOMEM
    assert k.mmap(0, 30 * GiB, RW, SHANON).error == errno.ENOMEM
    assert k.mmap(0, 30 * GiB, RW, PRIV | NORES).ok
    assert k.mmap(0, 30 * GiB, C["PROT_READ"], PRIV).ok
    assert k.mmap(0, 30 * GiB, C["PROT_NONE"], PRIV).ok
    assert k.mmap(0, 20 * GiB, RW, PRIV).ok and k.mmap(0, 20 * GiB, RW, PRIV).ok
    m = h.meminfo()
    assert m["Committed_AS"] == 40 * GiB // 1024 > m["CommitLimit"]


def test_mode1_never_fails_mode2_limits() -> None:
    assert host(overcommit_memory=1).kernel.mmap(0, 100 * GiB, RW, PRIV).ok
    h = host(overcommit_memory=2)
    limit = h.kernel.commit_limit()
    assert limit == 12 * GiB
    assert h.kernel.mmap(0, 8 * GiB, RW, PRIV).ok
    assert h.kernel.mmap(0, 4 * GiB, RW, PRIV | NORES).error == errno.ENOMEM  # NORESERVE ignored
    assert h.kernel.mmap(0, 1 * GiB, RW, PRIV).ok
    assert h.kernel.mmap(0, 1 * GiB, C["PROT_READ"], PRIV).ok  # read-only private is free


def test_commit_limit_leaves_out_the_hugetlb_pool() -> None:
    h = host(hugepages={"2MiB": 4})
    assert h.meminfo()["CommitLimit"] == (24 * GiB - 4 * H2) // 2 // 1024
    assert h.kernel.mmap(0, 4 * H2, RW, HUGE).ok
    assert h.meminfo()["Committed_AS"] == 0  # hugetlb is not committed


def test_overcommit_kbytes() -> None:
    h = host(overcommit_memory=2, overcommit_kbytes=1024 * 1024)
    assert h.meminfo()["CommitLimit"] == 1024 * 1024
    assert h.kernel.mmap(0, 2 * GiB, RW, PRIV).error == errno.ENOMEM


def test_rlimit_as_counts_every_mapping() -> None:
    h = host(rlimit_as="1GiB", hugepages={"2MiB": 4})
    k = h.kernel
    assert k.mmap(0, 64 * MiB, RW, PRIV).ok
    assert k.mmap(0, 2 * GiB, C["PROT_NONE"], PRIV | NORES).error == errno.ENOMEM
    assert k.mmap(0, 4 * H2, RW, HUGE | NORES).ok
    assert k.total_vm() == 64 * MiB + 4 * H2
    assert k.mmap(0, GiB - 64 * MiB - 4 * H2 + 4096, RW, PRIV).error == errno.ENOMEM


def test_memcg_limit_is_an_oom_kill_at_fault_time() -> None:
    h = host(memcg_max="64MiB")
    k = h.kernel
    a = k.mmap(0, 128 * MiB, RW, PRIV)
    assert a.ok  # mmap never fails for memcg
    assert k.touch(a.value, 32 * MiB, 4096).ok
    r = k.madvise(a.value, 128 * MiB, C["MADV_POPULATE_WRITE"])
    assert r.signal == 9
    info = k.crash_info()
    assert info["signal"] == "SIGKILL" and info["where"] == "madvise(MADV_POPULATE_WRITE)"
    assert info["hugepage_size"] is None and "memory cgroup" in info["detail"]
    assert k.close(1_000_000).signal == 9


def test_hugetlb_cgroup_limit_sigbus_at_fault() -> None:
    h = host(hugepages={"2MiB": 8}, hugetlb_cgroup_max={"2MiB": 2 * H2})
    k = h.kernel
    a = k.mmap(0, 4 * H2, RW, HUGE).value  # reservation is not limited by .max
    assert k.madvise(a, 4 * H2, C["MADV_POPULATE_WRITE"]).error == errno.EFAULT
    assert h.hugepages().free == 6
    assert k.touch(a, 4 * H2, H2).signal == 7
    assert "hugetlb cgroup" in h.crash.detail


def test_populate_needs_5_14() -> None:
    h = host(kernel_version="5.13.0")
    a = h.kernel.mmap(0, 4096, RW, PRIV).value
    assert h.kernel.madvise(a, 4096, C["MADV_POPULATE_WRITE"]).error == errno.EINVAL
    assert h.kernel.madvise(0, 0, C["MADV_POPULATE_WRITE"]).error == errno.EINVAL
    assert h.kernel.madvise(a, 4096, C["MADV_DONTNEED"]).ok


def test_map_huge_encoding_ignored_before_3_8() -> None:
    h = host(kernel_version="3.7.0", hugepages={"2MiB": 1})
    r = h.kernel.mmap(0, H2, RW, HUGE | (30 << C["MAP_HUGE_SHIFT"]))
    assert r.ok and h.hugepages().reserved == 1  # the default size was used


def test_map_populate_hides_hugetlb_failure() -> None:
    h = host(hugepages={"2MiB": 1})
    r = h.kernel.mmap(0, 2 * H2, RW, HUGE | NORES | C["MAP_POPULATE"])
    assert r.ok and h.crash is None and h.hugepages().free == 0


def test_munmap_uncharges_committed() -> None:
    h = host()
    a = h.kernel.mmap(0, GiB, RW, PRIV).value
    assert h.kernel.committed_as() == GiB
    assert h.kernel.munmap(a, GiB // 2).ok
    assert h.kernel.committed_as() == GiB // 2
