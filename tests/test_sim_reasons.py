"""SimKernel's reasons: every errno and every simulated signal comes with the rule and numbers."""

from __future__ import annotations

import signal

import pytest

from umbp_sim import _native
from umbp_sim.machine import GiB, Machine, MiB
from umbp_sim.sim import SimHost

C = _native.constants
RW = C["PROT_READ"] | C["PROT_WRITE"]
PRIV = C["MAP_PRIVATE"] | C["MAP_ANONYMOUS"]
HUGE = PRIV | C["MAP_HUGETLB"]


def host(**kw: object) -> SimHost:
    return SimHost(Machine.x86_64(**kw))  # type: ignore[arg-type]


def last(h: SimHost):  # type: ignore[no-untyped-def]
    return h.reasons()[-1]


def test_hugetlb_reserve_enomem_numbers() -> None:
    h = host(hugepages={"2MiB": 100}, nr_overcommit_hugepages={"2MiB": 10})
    r = h.kernel.mmap(0, 512 * 2 * MiB, RW, HUGE, -1, 0)
    assert r.errno_name == "ENOMEM"
    x = last(h)
    assert (x.call, x.rule, x.errno, x.signal) == ("mmap", "hugetlb_reserve", "ENOMEM", None)
    assert x.numbers == {
        "hugepage_size": 2 * MiB, "pages_needed": 512, "free": 100, "reserved": 0,
        "available": 100, "surplus": 0, "surplus_allowed": 10,
    }  # fmt: skip
    assert x.text.endswith("allows 10 more: ENOMEM")


def test_surplus_gathered_is_an_event_not_an_error() -> None:
    h = host(hugepages={"2MiB": 100}, nr_overcommit_hugepages={"2MiB": 1000})
    assert h.kernel.mmap(0, 512 * 2 * MiB, RW, HUGE, -1, 0).ok
    (x,) = h.reasons()
    assert (x.rule, x.errno, x.signal) == ("hugetlb_surplus_gathered", None, None)
    assert x.numbers["surplus_allowed"] == 1000 and h.hugepages(2 * MiB).surplus == 412


@pytest.mark.parametrize(
    ("machine", "call", "rule", "errno"),
    [
        ({"rlimit_as": GiB}, ("mmap", 2 * GiB, PRIV), "rlimit_as", "ENOMEM"),
        ({"overcommit_memory": 2, "mem_per_node": "4GiB"}, ("mmap", 8 * GiB, PRIV),
         "commit_limit", "ENOMEM"),
        ({}, ("mmap", 64 * MiB, PRIV | C["MAP_HUGETLB"] | (22 << C["MAP_HUGE_SHIFT"])),
         "hugepage_size_unknown", "EINVAL"),
        ({}, ("mmap", 0, PRIV), "arguments", "EINVAL"),
        ({"kernel_version": "5.10.0"}, ("madvise", 4096, C["MADV_POPULATE_WRITE"]),
         "populate_unsupported", "EINVAL"),
        ({"kernel_version": "3.16.0"}, ("memfd", 0), "memfd_unsupported", "ENOSYS"),
        ({"kernel_version": "4.13.0"}, ("memfd", C["MFD_HUGETLB"]), "memfd_hugetlb_unsupported",
         "EINVAL"),
    ],
)  # fmt: skip
def test_every_errno_has_a_reason(machine: dict, call: tuple, rule: str, errno: str) -> None:  # type: ignore[type-arg]
    h = host(**machine)
    k = h.kernel
    if call[0] == "mmap":
        r = k.mmap(0, call[1], RW, call[2], -1, 0)
    elif call[0] == "madvise":
        base = k.mmap(0, call[1], RW, PRIV, -1, 0).value
        r = k.madvise(base, call[1], call[2])
    else:
        r = k.memfd_create("x", call[1])
    assert r.errno_name == errno
    x = last(h)
    assert (x.rule, x.errno) == (rule, errno), x


def test_mbind_to_a_node_without_memory() -> None:
    m = Machine.x86_64(nodes=2, mem_per_node="4GiB")
    m.nodes[1].mem_total = 0
    h = SimHost(m)
    base = h.kernel.mmap(0, 2 * MiB, RW, PRIV, -1, 0).value
    r = h.kernel.mbind(base, 2 * MiB, C["MPOL_BIND"], [1], 64, 0)
    assert r.errno_name == "EINVAL"
    x = last(h)
    assert (x.rule, x.numbers) == ("mbind_node_without_memory", {"node": 1})


def test_oom_signal_reason_counts_reclaimable_memory() -> None:
    h = host(mem_per_node="8GiB", mem_free="1GiB", page_cache="3GiB")
    base = h.kernel.mmap(0, 6 * GiB, RW, PRIV, -1, 0).value
    r = h.kernel.madvise(base, 6 * GiB, C["MADV_POPULATE_WRITE"])
    assert r.signal == signal.SIGKILL
    x = last(h)
    assert (x.rule, x.signal, x.errno) == ("oom", "SIGKILL", None)
    assert x.numbers["node_free"] == GiB and x.numbers["reclaimable"] == 3 * GiB
    assert x.numbers["bytes_faulted"] == 4 * GiB and x.numbers["bytes_needed"] == 6 * GiB
    assert h.crash is not None and h.crash.detail == x.text


def test_reclaim_shrinks_cached_and_memavailable() -> None:
    h = host(mem_per_node="8GiB", mem_free="1GiB", page_cache="3GiB")
    before = h.meminfo()
    base = h.kernel.mmap(0, 2 * GiB, RW, PRIV, -1, 0).value
    assert h.kernel.madvise(base, 2 * GiB, C["MADV_POPULATE_WRITE"]).ok
    after = h.meminfo()
    assert before["Cached"] - after["Cached"] == GiB // 1024  # 1 GiB free + 1 GiB reclaimed
    assert before["MemAvailable"] - after["MemAvailable"] == 2 * GiB // 1024
    assert h.reclaimable() == 2 * GiB
    assert h.kernel.munmap(base, 2 * GiB).ok
    assert h.meminfo()["MemFree"] == 2 * GiB // 1024  # freed pages go to the buddy allocator


def test_reasons_are_bounded() -> None:
    h = host()
    for _ in range(5000):
        h.kernel.mmap(0, 0, RW, PRIV, -1, 0)
    n = len(h.reasons())
    assert 2048 <= n <= 4096
    h.kernel.clear_reasons()
    assert h.reasons() == []
    h.kernel.mmap(0, 0, RW, PRIV, -1, 0)
    assert last(h).rule == "arguments"


# A fault in a mapping is explained for the mapping, not for the page that faulted: an
# allocator that touches page by page (mori's manual prefault, run through the interposer, one
# fault per page) must get the same numbers as one populate of the whole buffer.


def test_a_hugepage_fault_counts_the_mapping_page_by_page() -> None:
    m = Machine.x86_64(nodes=2, hugepages_per_node=[{"2MiB": 1024}, {}])
    h = SimHost(m)
    base = h.kernel.mmap(0, GiB, RW, HUGE, -1, 0).value
    assert h.kernel.mbind(base, GiB, C["MPOL_BIND"], [1], 64, 0).ok
    r = h.kernel.touch(base, 2 * MiB, 1)  # the first page, as a fault would
    assert r.signal == signal.SIGBUS
    x = last(h)
    assert x.rule == "hugetlb_fault_no_page"
    assert (x.numbers["pages_needed"], x.numbers["node_free"], x.numbers["pages_faulted"]) == (
        512,
        0,
        0,
    )


def test_an_oom_page_by_page_has_the_numbers_of_one_populate() -> None:
    def numbers(page_by_page: bool) -> dict[str, int]:
        h = host(mem_per_node="8GiB", mem_free="1GiB", page_cache="3GiB")
        base = h.kernel.mmap(0, 6 * GiB, RW, PRIV, -1, 0).value
        if page_by_page:
            for off in range(0, 6 * GiB, 64 * MiB):
                r = h.kernel.touch(base + off, 64 * MiB, 1)
                if r.signal:
                    break
        else:
            r = h.kernel.madvise(base, 6 * GiB, C["MADV_POPULATE_WRITE"])
        assert r.signal == signal.SIGKILL
        x = last(h)
        assert x.rule == "oom"
        return {k: x.numbers[k] for k in ("bytes_needed", "bytes_faulted", "node_free")}

    assert numbers(page_by_page=True) == numbers(page_by_page=False) == {
        "bytes_needed": 6 * GiB, "bytes_faulted": 4 * GiB, "node_free": GiB,
    }  # fmt: skip


def test_pages_freed_by_dontneed_are_counted_again_from_their_next_fault() -> None:
    # 6.1: MADV_DONTNEED frees the touched hugepages without restoring their reservation (6.8+
    # does), so a second mapping can take them before the first faults again. The refault's
    # numbers are what the nodes hold then, not what they held at the mapping's first fault.
    h = host(hugepages={"2MiB": 4}, kernel_version="6.1.0")
    k = h.kernel
    a = k.mmap(0, 8 * MiB, RW, HUGE, -1, 0).value
    assert k.touch(a, 8 * MiB, 1).ok
    assert k.madvise(a, 8 * MiB, C["MADV_DONTNEED"]).ok
    b = k.mmap(0, 4 * MiB, RW, HUGE | C["MAP_NORESERVE"], -1, 0).value
    assert k.touch(b, 4 * MiB, 1).ok
    for off in range(0, 8 * MiB, 2 * MiB):
        r = k.touch(a + off, 2 * MiB, 1)
        if r.signal:
            break
    assert (r.signal, off) == (signal.SIGBUS, 4 * MiB)
    x = last(h)
    assert x.rule == "hugetlb_fault_no_page"
    assert (x.numbers["pages_needed"], x.numbers["node_free"], x.numbers["pages_faulted"]) == (
        4,
        2,
        2,
    )


def test_anonymous_pages_freed_by_dontneed_are_counted_again_from_their_next_fault() -> None:
    h = host(mem_per_node="8GiB", mem_free="2GiB")
    k = h.kernel
    a = k.mmap(0, GiB, RW, PRIV, -1, 0).value
    assert k.madvise(a, GiB, C["MADV_POPULATE_WRITE"]).ok
    assert k.madvise(a, GiB, C["MADV_DONTNEED"]).ok
    b = k.mmap(0, 2 * GiB, RW, PRIV, -1, 0).value
    assert k.madvise(b, 3 * GiB // 2, C["MADV_POPULATE_WRITE"]).ok
    for off in range(0, GiB, 64 * MiB):
        r = k.touch(a + off, 64 * MiB, 1)
        if r.signal:
            break
    assert r.signal == signal.SIGKILL
    x = last(h)
    assert x.rule == "oom"
    assert (x.numbers["bytes_needed"], x.numbers["node_free"]) == (GiB, GiB // 2)
