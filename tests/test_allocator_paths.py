"""Every path of csrc/allocator, reached with fault plans over the real kernel (no hugepages,
one NUMA node needed). Each test asserts the handle, the exact warning text the allocator
documents (host_mem_allocator.cpp header), the syscalls made, and what is left behind."""

from __future__ import annotations

import logging
import re

import pytest

import umbp_sim.allocator as allocator_module
from umbp_sim import _native
from umbp_sim.allocator import (
    Anonymous,
    AnonymousHugetlb,
    AnonymousShm,
    AnonymousShmHugetlb,
    UMBPHostMemAllocator,
)
from umbp_sim.errors import SimulatedCrash
from umbp_sim.faults import FaultPlan, FaultRule
from umbp_sim.host.leaks import collect_leaks
from umbp_sim.host.trace import instrument

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
HUGE_COUNTERS_0 = "HugePages of 2048 kB: free 0, total 0, reserved 0"

# Pinned host facts, so the texts do not depend on this machine's pools and nodes.
PIN = (
    FaultRule(op="read_file", content="0\n", path="/sys/kernel/mm/hugepages/hugepages-2048kB/*"),
    FaultRule(op="read_file", content="0\n", path="/sys/devices/system/node/possible"),
)
HUGETLB_MMAP_ENOMEM = FaultRule(op="mmap", errno="ENOMEM", flags_has=("MAP_HUGETLB",))


class Run:
    """An allocator on Tracing(Faulty(LinuxKernel)) with the given rules before the pins."""

    def __init__(self, rules, caplog):
        self.linux = _native.LinuxKernel()
        self.st = instrument(self.linux, FaultPlan(tuple(rules) + PIN))
        self.alloc = UMBPHostMemAllocator(self.st.kernel)
        self.caplog = caplog

    @property
    def tracing(self):
        return self.st.tracing

    def warnings(self):
        return [
            r.getMessage()
            for r in self.caplog.records
            if r.name == "umbp_sim.allocator" and r.levelno == logging.WARNING
        ]

    def ops(self):
        return [r.op for r in self.tracing.records() if r.op != "read_file"]

    def leaks(self):
        return collect_leaks(self.st.kernel, self.alloc)

    def cleanup(self):
        # What a failed munmap/close left behind on the real host goes away here.
        for addr, length in self.tracing.live_mappings():
            self.linux.munmap(addr, length)
        for fd in self.tracing.open_fds():
            self.linux.close(fd)


@pytest.fixture
def run(caplog):
    caplog.set_level(logging.INFO, logger="umbp_sim.allocator")
    runs = []

    def make(*rules):
        r = Run(rules, caplog)
        runs.append(r)
        return r

    yield make
    for r in runs:
        r.cleanup()


def fd_of(run, op="memfd_create"):
    return [r.result.value for r in run.tracing.records() if r.op == op][-1]


# ---- argument checks -------------------------------------------------------------------


def test_size_zero(run):
    r = run()
    h = r.alloc.alloc(0)
    assert not h
    assert r.warnings() == ["Alloc(size=0): nothing to allocate; returning an invalid handle"]
    assert r.ops() == []


@pytest.mark.parametrize("backing, pages", [(Anonymous, "4 KiB"), (AnonymousHugetlb, "2048 kB")])
def test_size_overflow(run, backing, pages):
    r = run()
    assert not r.alloc.alloc(2**64 - 1, backing)
    assert r.warnings() == [
        f"Alloc(size=18446744073709551615): rounding up to {pages} pages overflows; "
        "returning an invalid handle"
    ]
    assert r.ops() == []


@pytest.mark.parametrize(
    "backing, to", [(AnonymousHugetlb, "Anonymous"), (AnonymousShmHugetlb, "AnonymousShm")]
)
def test_hugepage_size_not_a_power_of_two(run, backing, to):
    r = run()
    h = r.alloc.alloc(4096, backing, hugepage_size=3 * MiB)
    assert h and h.actual_backing.name == to and h.actual_alignment == 4096
    r.alloc.alloc(4096, backing, hugepage_size=3 * MiB)  # once per kernel
    assert r.warnings() == [
        f"hugepage_size 3145728 is not a power of two; falling back to 4 KiB pages ({to})"
    ]


def test_hugepage_size_not_above_the_base_page(run):
    r = run()
    h = r.alloc.alloc(4096, AnonymousHugetlb, hugepage_size=4096)
    assert h and h.actual_backing == Anonymous
    assert r.warnings() == [
        "hugepage_size 4096 cannot be encoded in MAP_HUGE_* (not larger than the 4 KiB base "
        "page); falling back to 4 KiB pages (Anonymous)"
    ]
    r.alloc.free(h)
    assert r.leaks() == []


# ---- Anonymous / AnonymousHugetlb mmap ------------------------------------------------


def test_anonymous_mmap_enomem_is_an_invalid_handle(run):
    r = run(FaultRule(op="mmap", errno="ENOMEM"))
    assert not r.alloc.alloc(4096)
    assert r.warnings() == [
        "mmap of 4096 bytes (Anonymous, 4 KiB pages) failed: ENOMEM; returning an invalid handle"
    ]
    assert r.leaks() == []


def test_hugetlb_mmap_enomem_demotes_once(run):
    r = run(HUGETLB_MMAP_ENOMEM)
    h = r.alloc.alloc(2 * MiB, AnonymousHugetlb)
    assert h and h.actual_backing == Anonymous and h.mapped_size == 2 * MiB
    h2 = r.alloc.alloc(2 * MiB, AnonymousHugetlb)
    assert r.warnings() == [
        f"hugetlb mmap of 2097152 bytes (2048 kB pages) failed: ENOMEM; {HUGE_COUNTERS_0}; "
        "falling back to 4 KiB pages (Anonymous)"
    ]
    assert r.ops() == ["mmap", "mmap", "madvise"] * 2
    assert (
        r.tracing.records()[0]
        .text()
        .startswith(
            "mmap(NULL, 2097152, PROT_READ|PROT_WRITE, "
            "MAP_PRIVATE|MAP_ANONYMOUS|MAP_HUGETLB|MAP_HUGE_2MB, -1, 0) = -1 ENOMEM (injected)"
        )
    )
    r.alloc.free(h)
    r.alloc.free(h2)
    assert r.leaks() == []


@pytest.mark.parametrize(
    "rules, counters",
    [
        # sysfs unreadable: /proc/meminfo, which describes the default (2 MiB) size
        (
            [
                FaultRule(op="read_file", errno="ENOENT", path="/sys/kernel/mm/hugepages/*"),
                FaultRule(
                    op="read_file",
                    path="/proc/meminfo",
                    content="MemTotal: 1 kB\nHugePages_Total:       4\nHugePages_Free:        3\n"
                    "HugePages_Rsvd:        2\nHugepagesize:       2048 kB\n",
                ),
            ],
            "HugePages of 2048 kB: free 3, total 4, reserved 2",
        ),
        (
            [
                FaultRule(op="read_file", content="x\n", path="/sys/kernel/mm/hugepages/*"),
                FaultRule(
                    op="read_file",
                    path="/proc/meminfo",
                    content="HugePages_Total: 4\nHugePages_Free: 3\nHugepagesize: 2048 kB\n",
                ),
            ],
            "HugePages of 2048 kB: counters unavailable",
        ),
        (
            [
                FaultRule(
                    op="read_file",
                    content="99999999999999999999999\n",
                    path="/sys/kernel/mm/hugepages/*",
                ),
                FaultRule(op="read_file", errno="EACCES", path="/proc/meminfo"),
            ],
            "HugePages of 2048 kB: counters unavailable",
        ),
        (
            [
                FaultRule(op="read_file", errno="ENOENT", path="/sys/kernel/mm/hugepages/*"),
                FaultRule(op="read_file", path="/proc/meminfo", content="MemTotal: 1 kB\n"),
            ],
            "HugePages of 2048 kB: counters unavailable",
        ),
    ],
)
def test_hugetlb_counter_sources(run, rules, counters):
    r = run(HUGETLB_MMAP_ENOMEM, *rules)
    h = r.alloc.alloc(4096, AnonymousHugetlb)
    assert h.actual_backing == Anonymous
    assert r.warnings() == [
        f"hugetlb mmap of 2097152 bytes (2048 kB pages) failed: ENOMEM; {counters}; "
        "falling back to 4 KiB pages (Anonymous)"
    ]
    r.alloc.free(h)


def test_hugetlb_size_not_configured(run):
    r = run(
        HUGETLB_MMAP_ENOMEM,
        FaultRule(op="read_file", errno="ENOENT", path="/sys/kernel/mm/hugepages/*"),
        FaultRule(op="read_file", path="/proc/meminfo", content="Hugepagesize:       2048 kB\n"),
    )
    h = r.alloc.alloc(GiB, AnonymousHugetlb, hugepage_size=GiB, prefault=False)
    assert h.actual_backing == Anonymous and h.mapped_size == GiB
    assert r.warnings() == [
        "hugetlb mmap of 1073741824 bytes (1048576 kB pages) failed: ENOMEM; HugePages of "
        "1048576 kB: not configured on this kernel; falling back to 4 KiB pages (Anonymous)"
    ]
    assert "MAP_HUGE_1GB" in r.tracing.records()[0].text()
    r.alloc.free(h)


# ---- memfd-backed ----------------------------------------------------------------------


def test_shm_ok_and_registry(run):
    r = run()
    h = r.alloc.alloc(4096, AnonymousShm)
    assert h and h.fd >= 0 and h.actual_backing == AnonymousShm
    assert r.ops() == ["memfd_create", "ftruncate", "mmap", "madvise"]
    assert r.tracing.records()[0].text() == (
        f'memfd_create("umbp_host_buffer", MFD_CLOEXEC) = {h.fd}'
    )
    assert r.alloc.lookup_shm_allocation(h.ptr + 100, 10).fd == h.fd
    assert r.alloc.lookup_shm_allocation(h.ptr + 100, 4096) is None  # runs past the end
    assert r.alloc.lookup_shm_allocation(0, 10) is None
    assert r.alloc.lookup_shm_allocation(2**64 - 10, 100) is None
    assert r.alloc.acquire_shm_allocation(h.ptr - 4096, 10) is None
    assert r.alloc.lookup_shm_allocation(h.ptr, 0) is None
    assert r.leaks() == [
        f"mapping {h.ptr:#x} length 4096 (4KiB) still mapped",
        f"fd {h.fd} still open",
        f"buffer {h.ptr:#x} (4096 bytes, AnonymousShm) not freed",
        f"shm registry entry {h.ptr:#x} (4096 bytes, fd {h.fd}, 0 registration(s)) still held",
    ]
    r.alloc.free(h)
    assert r.leaks() == []
    assert r.warnings() == []


def test_memfd_create_failure(run):
    r = run(FaultRule(op="memfd_create", errno="EMFILE"))
    assert not r.alloc.alloc(4096, AnonymousShm)
    assert r.warnings() == [
        "memfd_create(umbp_host_buffer) failed: EMFILE; returning an invalid handle"
    ]


def test_hugetlb_memfd_create_failure_demotes(run):
    r = run(FaultRule(op="memfd_create", errno="EINVAL", memfd_flags_has=("MFD_HUGETLB",)))
    h = r.alloc.alloc(4096, AnonymousShmHugetlb)
    assert h and h.actual_backing == AnonymousShm and h.mapped_size == 4096
    assert r.warnings() == [
        f"hugetlb memfd_create (2048 kB pages) failed: EINVAL; {HUGE_COUNTERS_0}; "
        "falling back to 4 KiB pages (AnonymousShm)"
    ]
    assert r.tracing.records()[0].text() == (
        'memfd_create("umbp_host_buffer_hugetlb", MFD_CLOEXEC|MFD_HUGETLB|MFD_HUGE_2MB)'
        " = -1 EINVAL (injected)"
    )
    r.alloc.free(h)
    assert r.leaks() == []


def test_ftruncate_failure_closes_the_memfd(run):
    r = run(FaultRule(op="ftruncate", errno="EFBIG"))
    assert not r.alloc.alloc(4096, AnonymousShm)
    assert r.warnings() == [
        "ftruncate of the memfd to 4096 bytes failed: EFBIG; returning an invalid handle"
    ]
    assert r.ops() == ["memfd_create", "ftruncate", "close"]
    assert r.leaks() == []


def test_ftruncate_failure_and_close_failure(run):
    r = run(FaultRule(op="ftruncate", errno="EFBIG"), FaultRule(op="close", errno="EIO"))
    assert not r.alloc.alloc(4096, AnonymousShm)
    fd = fd_of(r)
    assert r.warnings() == [
        f"close({fd}) of a memfd after a failed Alloc step failed: EIO",
        "ftruncate of the memfd to 4096 bytes failed: EFBIG; returning an invalid handle",
    ]
    assert r.leaks() == []  # Linux releases the fd even when close() reports EIO


def test_hugetlb_ftruncate_failure_demotes(run):
    r = run(FaultRule(op="ftruncate", errno="EINVAL", nth=1))
    h = r.alloc.alloc(4096, AnonymousShmHugetlb)
    assert h.actual_backing == AnonymousShm
    assert r.warnings() == [
        "hugetlb ftruncate of the memfd to 2097152 bytes (2048 kB pages) failed: EINVAL; "
        f"{HUGE_COUNTERS_0}; falling back to 4 KiB pages (AnonymousShm)"
    ]
    r.alloc.free(h)
    assert r.leaks() == []


def test_shm_mmap_failure(run):
    r = run(FaultRule(op="mmap", errno="ENOMEM", flags_has=("MAP_SHARED",)))
    assert not r.alloc.alloc(4096, AnonymousShm)
    assert r.warnings() == [
        "mmap of 4096 bytes (AnonymousShm, 4 KiB pages) failed: ENOMEM; returning an invalid handle"
    ]
    assert r.ops() == ["memfd_create", "ftruncate", "mmap", "close"]
    assert r.leaks() == []


def test_hugetlb_shm_mmap_failure_demotes(run):
    r = run(FaultRule(op="mmap", errno="ENOMEM", flags_has=("MAP_SHARED",), nth=1))
    h = r.alloc.alloc(4096, AnonymousShmHugetlb)
    assert h.actual_backing == AnonymousShm
    assert r.warnings() == [
        f"hugetlb mmap of 2097152 bytes (2048 kB pages) failed: ENOMEM; {HUGE_COUNTERS_0}; "
        "falling back to 4 KiB pages (AnonymousShm)"
    ]
    r.alloc.free(h)
    assert r.leaks() == []


# ---- NUMA binding ------------------------------------------------------------------------


def test_bind_ok(run):
    r = run()
    h = r.alloc.alloc(4096, numa_node=0)
    assert h.numa_node == 0
    (mb,) = [x for x in r.tracing.records() if x.op == "mbind"]
    assert mb.text() == f"mbind({h.ptr:#x}, 4096, MPOL_BIND, [0], 2, 0) = 0"
    assert r.warnings() == []
    r.alloc.free(h)


@pytest.mark.parametrize(
    "rule, node, text",
    [
        (
            FaultRule(op="read_file", errno="ENOENT", path="/sys/devices/system/node/possible"),
            0,
            "numa_node 0 requested but /sys/devices/system/node/possible cannot be read (ENOENT);"
            " buffer not bound",
        ),
        (
            FaultRule(op="read_file", content="zero\n", path="/sys/devices/system/node/possible"),
            0,
            "numa_node 0 requested but /sys/devices/system/node/possible cannot be parsed "
            "('zero'); buffer not bound",
        ),
        (
            FaultRule(op="read_file", content="3-1\n", path="/sys/devices/system/node/possible"),
            2,
            "numa_node 2 requested but /sys/devices/system/node/possible cannot be parsed "
            "('3-1'); buffer not bound",
        ),
        (
            FaultRule(op="read_file", content="\n", path="/sys/devices/system/node/possible"),
            0,
            "numa_node 0 is not a possible NUMA node (possible: ); buffer not bound",
        ),
        (None, 5, "numa_node 5 is not a possible NUMA node (possible: 0); buffer not bound"),
        (
            FaultRule(
                op="read_file", content="0,2-4,40000-50000\n", path="/sys/devices/system/node/*"
            ),
            40000,
            "numa_node 40000 is not a possible NUMA node (possible: 0,2-4,40000-50000); "
            "buffer not bound",
        ),
        (
            FaultRule(op="mbind", errno="EINVAL", node=0),
            0,
            "mbind(MPOL_BIND, node 0) of 4096 bytes failed: EINVAL; buffer not bound to node 0",
        ),
    ],
)
def test_bind_not_done(run, rule, node, text):
    r = run(*([rule] if rule else []))
    h = r.alloc.alloc(4096, numa_node=node)
    assert h and h.numa_node == -1
    assert r.warnings() == [text]
    r.alloc.free(h)
    assert r.leaks() == []


def test_bind_to_a_listed_node_with_mbind_of_a_high_node(run):
    # Node 70 is "possible" per the file: the mask needs two longs and maxnode = 72.
    r = run(
        FaultRule(op="read_file", content="0-127\n", path="/sys/devices/system/node/possible"),
        FaultRule(op="mbind", errno="EINVAL", node=70),
    )
    h = r.alloc.alloc(4096, numa_node=70)
    (mb,) = [x for x in r.tracing.records() if x.op == "mbind"]
    assert mb.text() == (f"mbind({h.ptr:#x}, 4096, MPOL_BIND, [70], 72, 0) = -1 EINVAL (injected)")
    r.alloc.free(h)


# ---- prefault ----------------------------------------------------------------------------


def test_populate_einval_falls_back_to_touch(run):
    r = run(FaultRule(op="madvise", errno="EINVAL", advice="MADV_POPULATE_WRITE"))
    h = r.alloc.alloc(8192)
    assert h
    r.alloc.alloc(4096)  # warned once
    assert r.warnings() == [
        "madvise(MADV_POPULATE_WRITE) is not supported by this kernel (EINVAL; needs Linux "
        "5.14); prefaulting by touching one byte per page"
    ]
    touches = [x.text() for x in r.tracing.records() if x.op == "touch"]
    assert touches[0] == f"touch({h.ptr:#x}, 8192, 4096) = 0"


def test_touch_error_leaves_buffer_unpopulated(run):
    r = run(
        FaultRule(op="madvise", errno="EINVAL"),
        FaultRule(op="touch", errno="EFAULT"),
    )
    h = r.alloc.alloc(4096)
    assert h
    assert r.warnings()[1] == "prefault touch of 4096 bytes failed: EFAULT; buffer left unpopulated"
    r.alloc.free(h)
    assert r.leaks() == []


@pytest.mark.parametrize("err", ["ENOMEM", "EFAULT", "EHWPOISON"])
def test_populate_failure_unmaps_and_fails(run, err):
    r = run(FaultRule(op="madvise", errno=err))
    assert not r.alloc.alloc(4096)
    assert r.warnings() == [
        f"MADV_POPULATE_WRITE of 4096 bytes (Anonymous, 4 KiB pages) failed: {err}; unmapped, "
        "returning an invalid handle"
    ]
    assert r.ops() == ["mmap", "madvise", "munmap"]
    assert r.leaks() == []


def test_populate_failure_of_shm_closes_the_memfd(run):
    r = run(FaultRule(op="madvise", errno="ENOMEM"))
    assert not r.alloc.alloc(4096, AnonymousShm)
    assert r.ops() == ["memfd_create", "ftruncate", "mmap", "madvise", "munmap", "close"]
    assert r.leaks() == []


def test_cleanup_failures_are_reported(run):
    r = run(
        FaultRule(op="madvise", errno="ENOMEM"),
        FaultRule(op="munmap", errno="EINVAL"),
        FaultRule(op="close", errno="EIO"),
    )
    assert not r.alloc.alloc(4096, AnonymousShm)
    fd = fd_of(r)
    (m,) = [x for x in r.tracing.records() if x.op == "mmap"]
    addr = m.result.value
    assert r.warnings() == [
        f"munmap({addr:#x}, 4096) while cleaning up a failed Alloc failed: EINVAL",
        f"close({fd}) of the memfd of {addr:#x} failed: EIO",
        "MADV_POPULATE_WRITE of 4096 bytes (AnonymousShm, 4 KiB pages) failed: ENOMEM; "
        "unmapped, returning an invalid handle",
    ]
    # the failed munmap leaves the mapping; the fd is released despite close()'s EIO
    assert r.leaks() == [f"mapping {addr:#x} length 4096 (4KiB) still mapped"]


def test_uncommon_errno_is_named_in_warning(run):
    # The allocator names errnos from the same table as the trace (kernel/syscall_format).
    r = run(FaultRule(op="mmap", errno="ERANGE"))
    assert not r.alloc.alloc(4096)
    assert r.warnings() == [
        "mmap of 4096 bytes (Anonymous, 4 KiB pages) failed: ERANGE; returning an invalid handle"
    ]


# ---- simulated crashes -------------------------------------------------------------------


@pytest.mark.parametrize(
    "rules, backing, where",
    [
        ([FaultRule(op="mmap", signal="SIGKILL")], Anonymous, "mmap"),
        ([FaultRule(op="memfd_create", signal="SIGKILL")], AnonymousShm, "memfd_create"),
        ([FaultRule(op="ftruncate", signal="SIGKILL")], AnonymousShm, "ftruncate"),
        ([FaultRule(op="mmap", signal="SIGKILL")], AnonymousShm, "mmap"),
        (
            [FaultRule(op="ftruncate", errno="EFBIG"), FaultRule(op="close", signal="SIGKILL")],
            AnonymousShm,
            "close",
        ),
        (
            [FaultRule(op="mmap", errno="ENOMEM"), FaultRule(op="close", signal="SIGKILL")],
            AnonymousShm,
            "close",
        ),
        ([FaultRule(op="madvise", signal="SIGBUS")], Anonymous, "madvise(MADV_POPULATE_WRITE)"),
        (
            [FaultRule(op="madvise", errno="EINVAL"), FaultRule(op="touch", signal="SIGBUS")],
            Anonymous,
            "prefault touch",
        ),
        (
            [FaultRule(op="madvise", errno="ENOMEM"), FaultRule(op="munmap", signal="SIGKILL")],
            Anonymous,
            "munmap",
        ),
        (
            [FaultRule(op="madvise", errno="ENOMEM"), FaultRule(op="close", signal="SIGKILL")],
            AnonymousShm,
            "close",
        ),
    ],
)
def test_crash_in_alloc(run, rules, backing, where):
    r = run(*rules)
    with pytest.raises(SimulatedCrash) as info:
        r.alloc.alloc(4096, backing)
    sig = [x for x in rules if x.signal][0].signal
    assert (info.value.signal, info.value.where) == (sig, where)
    assert str(info.value) == f"killed by {sig} during {where}"
    # The dead process made no further call after the fatal one.
    assert r.tracing.records()[-1].result.signal != 0
    assert r.alloc.snapshot() == {"live": [], "shm": []}


def test_crash_in_mbind(run):
    r = run(FaultRule(op="mbind", signal="SIGKILL"))
    with pytest.raises(SimulatedCrash, match="^killed by SIGKILL during mbind$"):
        r.alloc.alloc(4096, numa_node=0)


# ---- free ----------------------------------------------------------------------------------


def test_munmap_failure_still_invalidates_the_handle(run):
    r = run(FaultRule(op="munmap", errno="EINVAL", nth=1))
    h = r.alloc.alloc(4096)
    addr = h.ptr
    r.alloc.free(h)
    assert not h and h.ptr == 0 and h.mapped_size == 0 and h.requested_size == 0
    assert r.warnings() == [
        f"munmap({addr:#x}, 4096) failed: EINVAL; handle invalidated anyway so a later Free "
        "cannot unmap a reused address"
    ]
    r.alloc.free(h)  # a second free is a no-op: no second munmap
    assert r.ops().count("munmap") == 1
    assert r.leaks() == [f"mapping {addr:#x} length 4096 (4KiB) still mapped"]


def test_free_close_failure(run):
    r = run(FaultRule(op="close", errno="EIO", nth=1))
    h = r.alloc.alloc(4096, AnonymousShm)
    fd, addr = h.fd, h.ptr
    r.alloc.free(h)
    assert r.warnings() == [f"close({fd}) of the memfd of {addr:#x} failed: EIO"]
    assert r.leaks() == []  # Linux releases the fd even when close() reports EIO


@pytest.mark.parametrize("op, backing", [("munmap", Anonymous), ("close", AnonymousShm)])
def test_crash_in_free(run, op, backing):
    r = run(FaultRule(op=op, signal="SIGKILL"))
    h = r.alloc.alloc(4096, backing)
    with pytest.raises(SimulatedCrash, match=f"^killed by SIGKILL during {op}$"):
        r.alloc.free(h)
    assert not h


def test_free_of_a_handle_another_kernel_owns(run):
    a, b = run(), run()
    h = a.alloc.alloc(4096)
    b.alloc.free(h)
    assert h and h.mapped_size == 4096
    assert b.warnings() == [
        f"Free of {h.ptr:#x}, which no allocator on this kernel owns (freed through a copy of its "
        "handle, or allocated on another kernel); nothing unmapped, handle unchanged"
    ]
    assert b.ops() == []
    a.alloc.free(h)
    assert a.leaks() == [] and b.leaks() == []


def test_a_second_allocator_on_the_same_kernel_shares_the_tables(run):
    r = run()
    other = UMBPHostMemAllocator(r.st.kernel)
    h = r.alloc.alloc(4096)
    other.free(h)
    assert not h and r.leaks() == []


# ---- deferred shm free -------------------------------------------------------------------


def test_deferred_free_until_the_last_release(run):
    r = run()
    h = r.alloc.alloc(4096, AnonymousShm)
    addr, fd = h.ptr, h.fd
    a1 = r.alloc.acquire_shm_allocation(addr, 4096)
    a2 = r.alloc.acquire_shm_allocation(addr + 10, 1)
    assert (a1.base, a1.fd, a2.base) == (addr, fd, addr)
    r.alloc.free(h)
    assert not h
    assert r.warnings() == [
        f"Free of AnonymousShm buffer {addr:#x} (4096 bytes) while 2 registration(s) hold it; "
        "munmap and close deferred to the last ReleaseShmAllocation"
    ]
    assert r.alloc.lookup_shm_allocation(addr, 1) is None  # pending free is not handed out
    assert r.leaks() == [
        f"mapping {addr:#x} length 4096 (4KiB) still mapped",
        f"fd {fd} still open",
        f"shm registry entry {addr:#x} (4096 bytes, fd {fd}, 2 registration(s)) (free deferred) "
        "still held",
    ]
    assert "munmap" not in r.ops()
    r.alloc.release_shm_allocation(addr)
    assert "munmap" not in r.ops()
    r.alloc.release_shm_allocation(addr)
    assert r.ops()[-2:] == ["munmap", "close"]
    assert r.leaks() == []
    r.alloc.release_shm_allocation(addr)
    assert r.warnings()[-1] == (
        f"ReleaseShmAllocation({addr:#x}): no shm allocation is based there; ignored"
    )


def test_release_without_acquire(run):
    r = run()
    h = r.alloc.alloc(4096, AnonymousShm)
    r.alloc.release_shm_allocation(h.ptr)
    assert r.warnings() == [
        f"ReleaseShmAllocation({h.ptr:#x}) without a matching AcquireShmAllocation; ignored"
    ]
    r.alloc.free(h)
    assert r.leaks() == []


@pytest.mark.parametrize(
    "rules, expect",
    [
        (
            [FaultRule(op="munmap", errno="EINVAL")],
            "deferred munmap({addr}, 4096) at the last ReleaseShmAllocation failed: EINVAL",
        ),
        ([FaultRule(op="close", errno="EIO")], "close({fd}) of the memfd of {addr} failed: EIO"),
    ],
)
def test_deferred_release_failures(run, rules, expect):
    r = run(*rules)
    h = r.alloc.alloc(4096, AnonymousShm)
    addr, fd = h.ptr, h.fd
    r.alloc.acquire_shm_allocation(addr, 1)
    r.alloc.free(h)
    r.alloc.release_shm_allocation(addr)
    assert r.warnings()[-1] == expect.format(addr=f"{addr:#x}", fd=fd)
    assert r.alloc.snapshot()["shm"] == []


@pytest.mark.parametrize("op", ["munmap", "close"])
def test_crash_in_deferred_release(run, op):
    r = run(FaultRule(op=op, signal="SIGKILL"))
    h = r.alloc.alloc(4096, AnonymousShm)
    r.alloc.acquire_shm_allocation(h.ptr, 1)
    base = h.ptr
    r.alloc.free(h)
    with pytest.raises(SimulatedCrash, match=f"^killed by SIGKILL during {op}$"):
        r.alloc.release_shm_allocation(base)


def test_leak_lines_name_every_kind(run):
    r = run()
    h = r.alloc.alloc(4096, AnonymousShm)
    assert re.fullmatch(r"buffer 0x[0-9a-f]+ \(4096 bytes, AnonymousShm\) not freed", r.leaks()[2])
    r.alloc.free(h)


# ---- every errno name the warnings spell -------------------------------------------------


@pytest.mark.parametrize(
    "err",
    [
        "EPERM",
        "ENOENT",
        "EINTR",
        "EIO",
        "EBADF",
        "EAGAIN",
        "ENOMEM",
        "EACCES",
        "EFAULT",
        "EBUSY",
        "EEXIST",
        "ENODEV",
        "EINVAL",
        "ENFILE",
        "EMFILE",
        "EFBIG",
        "ENOSPC",
        "ENOSYS",
        "EOVERFLOW",
        "EOPNOTSUPP",
        "EHWPOISON",
    ],
)
def test_errno_names_in_warnings(run, err):
    r = run(FaultRule(op="mmap", errno=err))
    assert not r.alloc.alloc(4096)
    assert r.warnings() == [
        f"mmap of 4096 bytes (Anonymous, 4 KiB pages) failed: {err}; returning an invalid handle"
    ]


# ---- inputs the Python surface cannot produce, through the native binding ---------------


def test_unknown_backing_value(run):
    r = run()
    assert not r.alloc.alloc(4096, _native.UMBPHostBufferBacking(7))
    assert r.warnings() == ["Alloc: unknown backing 7; returning an invalid handle"]
    assert r.ops() == []


@pytest.mark.parametrize("native", [_native.UmbpSimAllocator, _native.Mori624002cAllocator])
def test_allocator_without_a_kernel(native):
    reported = []
    _native.set_outcome_hook(lambda *outcome: reported.append(outcome))
    try:
        a = native(None)
        handle = a.alloc(4096, Anonymous, 2 * MiB, -1, True)
        assert not handle
        assert [(o[0] is a, o[1:]) for o in reported] == [
            (True, ([("warning", "no-kernel", "Alloc: no kernel; returning an invalid handle")],
                    0, "")),
        ]  # fmt: skip
        assert a.kernel is None
        assert a.live_buffers() == [] and a.shm_registry() == []
        assert a.lookup_shm_allocation(4096, 1) is None
        assert a.acquire_shm_allocation(4096, 1) is None
        reported.clear()
        assert a.release_shm_allocation(4096) is None
        assert reported == []  # nothing to report: the hook is not called
    finally:
        _native.set_outcome_hook(allocator_module._report)


# ---- the never-throws contract: the kernel layer throws std::bad_alloc -------------------


def test_alloc_survives_a_throwing_kernel(run):
    r = run(FaultRule(op="mmap", throw="bad_alloc"))
    assert not r.alloc.alloc(4096)
    assert r.warnings() == ["Alloc: internal error (std::bad_alloc); returning an invalid handle"]
    assert r.tracing.records()[0].threw
    assert r.leaks() == []


def test_warning_text_that_throws_is_dropped_not_raised(run):
    # The counters of the demotion warning are read while the text is built.
    r = run(HUGETLB_MMAP_ENOMEM, FaultRule(op="read_file", throw="bad_alloc"))
    h = r.alloc.alloc(4096, AnonymousHugetlb)
    assert h and h.actual_backing == Anonymous
    assert r.warnings() == []
    r.alloc.free(h)
    assert r.leaks() == []


def test_free_survives_a_throwing_munmap(run):
    r = run(FaultRule(op="munmap", throw="bad_alloc", nth=1))
    h = r.alloc.alloc(4096)
    addr = h.ptr
    r.alloc.free(h)
    # nothing was released: the buffer is still owned and the handle still valid
    assert h and h.ptr == addr
    assert r.alloc.snapshot()["live"][0]["ptr"] == addr
    r.alloc.free(h)  # the retry unmaps it
    assert not h
    assert r.leaks() == []


def test_release_survives_a_throwing_munmap(run):
    r = run(FaultRule(op="munmap", throw="bad_alloc"))
    h = r.alloc.alloc(4096, AnonymousShm)
    base = h.ptr
    r.alloc.acquire_shm_allocation(base, 1)
    r.alloc.free(h)
    r.alloc.release_shm_allocation(base)
    assert r.alloc.snapshot()["shm"] == []


# ---- parsing corners of the files the allocator reads ------------------------------------

SYSFS_2M = "/sys/kernel/mm/hugepages/hugepages-2048kB/"


@pytest.mark.parametrize(
    "rules, counters",
    [
        (
            [FaultRule(op="read_file", content="\t 7\n", path=SYSFS_2M + "*")],
            "free 7, total 7, reserved 7",
        ),
        (
            [
                FaultRule(op="read_file", content="", path=SYSFS_2M + "free_hugepages"),
                FaultRule(op="read_file", path="/proc/meminfo", content="Hugepagesize: 2048 kB"),
            ],
            "counters unavailable",
        ),
        (
            [
                FaultRule(op="read_file", errno="ENOENT", path=SYSFS_2M + "nr_hugepages"),
                FaultRule(
                    op="read_file",
                    path="/proc/meminfo",
                    content="HugePages_Total: 4\nHugePages_Rsvd: 1\nHugepagesize: 2048 kB",
                ),
            ],
            "counters unavailable",
        ),
        (
            [
                FaultRule(op="read_file", errno="ENOENT", path=SYSFS_2M + "resv_hugepages"),
                FaultRule(
                    op="read_file",
                    path="/proc/meminfo",
                    content="HugePages_Free: 4\nHugePages_Rsvd: 1\nHugepagesize: 2048 kB",
                ),
            ],
            "counters unavailable",
        ),
    ],
)
def test_hugetlb_counter_parsing(run, rules, counters):
    r = run(HUGETLB_MMAP_ENOMEM, *rules)
    h = r.alloc.alloc(4096, AnonymousHugetlb)
    assert r.warnings() == [
        f"hugetlb mmap of 2097152 bytes (2048 kB pages) failed: ENOMEM; HugePages of 2048 kB: "
        f"{counters}; falling back to 4 KiB pages (Anonymous)"
    ]
    r.alloc.free(h)


@pytest.mark.parametrize(
    "possible, node, text",
    [
        ("0 \n", 0, None),
        ("0-1 \n", 1, None),
        (
            "0-x\n",
            0,
            "numa_node 0 requested but /sys/devices/system/node/possible cannot be parsed "
            "('0-x'); buffer not bound",
        ),
    ],
)
def test_possible_list_parsing(run, possible, node, text):
    r = run(
        FaultRule(op="read_file", content=possible, path="/sys/devices/system/node/possible"),
        FaultRule(op="mbind", errno="EINVAL", node=1),
    )
    h = r.alloc.alloc(4096, numa_node=node)
    if text is None:
        assert r.ops() == ["mmap", "mbind", "madvise"]
        assert h.numa_node == (0 if node == 0 else -1)
    else:
        assert r.warnings() == [text]
    r.alloc.free(h)


def test_release_of_one_of_two_registrations_keeps_the_buffer(run):
    r = run()
    h = r.alloc.alloc(4096, AnonymousShm)
    r.alloc.acquire_shm_allocation(h.ptr, 1)
    r.alloc.acquire_shm_allocation(h.ptr, 1)
    r.alloc.release_shm_allocation(h.ptr)
    assert r.alloc.snapshot()["shm"][0]["active_registrations"] == 1
    r.alloc.release_shm_allocation(h.ptr)
    r.alloc.free(h)
    assert r.leaks() == [] and r.warnings() == []
