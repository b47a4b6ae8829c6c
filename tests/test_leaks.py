"""Leak accounting: mappings and fds seen through a TracingKernel, plus any leaks() source."""

from __future__ import annotations

import re

import pytest

from umbp_sim import UMBPHostBufferBacking, UMBPHostMemAllocator, _native
from umbp_sim.faults import FaultPlan, FaultRule
from umbp_sim.host.leaks import assert_no_leaks, collect_leaks
from umbp_sim.host.trace import instrument

C = _native.constants
PRW = C["PROT_READ"] | C["PROT_WRITE"]
ANON = C["MAP_PRIVATE"] | C["MAP_ANONYMOUS"]


class FakeRegistry:
    def __init__(self, lines):
        self.lines = lines

    def leaks(self):
        return self.lines


def test_clean_run_has_no_leaks():
    st = instrument(_native.LinuxKernel())
    a = st.kernel.mmap(0, 8192, PRW, ANON).value
    fd = st.kernel.memfd_create("x", 0).value
    st.kernel.munmap(a, 8192)
    st.kernel.close(fd)
    assert collect_leaks(st.kernel) == []
    assert_no_leaks(st.kernel, FakeRegistry([]))


def test_failed_munmap_leaves_a_listed_leak():
    linux = _native.LinuxKernel()
    st = instrument(linux, FaultPlan((FaultRule(op="munmap", errno="EINVAL"),)))
    a = st.kernel.mmap(0, 2 << 20, PRW, ANON).value
    fd = st.kernel.memfd_create("x", 0).value
    assert st.kernel.munmap(a, 2 << 20).error == 22
    leaks = collect_leaks(st.kernel, FakeRegistry(["shm registry: buffer 0x10 (4096 bytes)"]))
    assert leaks == [
        f"mapping {a:#x} length 2097152 (2MiB) still mapped",
        f"fd {fd} still open",
        "shm registry: buffer 0x10 (4096 bytes)",
    ]
    with pytest.raises(AssertionError, match=re.escape(f"3 leaked: mapping {a:#x} length 2097152")):
        assert_no_leaks(st.kernel, FakeRegistry(["shm registry: buffer 0x10 (4096 bytes)"]))
    linux.munmap(a, 2 << 20)
    linux.close(fd)


def test_unknown_source_is_a_type_error():
    with pytest.raises(TypeError, match="collect_leaks: LinuxKernel is not a traced kernel"):
        collect_leaks(_native.LinuxKernel())
    assert collect_leaks(None) == []


def test_an_fd_the_allocators_bookkeeping_forgot_is_caught_by_the_kernel_ledger():
    # mori lets exceptions escape Alloc: a std::bad_alloc out of ftruncate leaves the memfd open
    # before any registry record names it. The allocator's own tables are empty; the traced
    # kernel, which saw memfd_create succeed and no close, still lists the fd.
    linux = _native.LinuxKernel()
    st = instrument(linux, FaultPlan((FaultRule(op="ftruncate", throw="bad_alloc"),)))
    alloc = UMBPHostMemAllocator(st.kernel, "mori-624002c")
    with pytest.raises(MemoryError):
        alloc.alloc(4096, UMBPHostBufferBacking.AnonymousShm)
    fd = next(r.result.value for r in st.tracing.records() if r.op == "memfd_create")
    assert alloc.snapshot() == {"live": [], "shm": []}
    assert collect_leaks(alloc) == []
    assert collect_leaks(st.kernel, alloc) == [f"fd {fd} still open"]
    linux.close(fd)
