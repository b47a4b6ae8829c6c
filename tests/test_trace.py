"""TracingKernel: strace-style text for every operation, the injected mark, the leak ledger."""

from __future__ import annotations

import errno

import pytest

from umbp_sim import _native
from umbp_sim.faults import FaultPlan, FaultRule
from umbp_sim.host.trace import find_layer, instrument, trace_text

C = _native.constants
PRW = C["PROT_READ"] | C["PROT_WRITE"]
ANON = C["MAP_PRIVATE"] | C["MAP_ANONYMOUS"]
PAGE = 4096


@pytest.fixture
def linux():
    return _native.LinuxKernel()


def test_the_issue_example_line(linux):
    plan = FaultPlan((FaultRule(op="mmap", errno="ENOMEM", flags_has=("MAP_HUGETLB",)),))
    st = instrument(linux, plan)
    r = st.kernel.mmap(0, 2097152, PRW, ANON | C["MAP_HUGETLB"] | (21 << 26))
    assert r.error == errno.ENOMEM
    assert st.tracing.text() == (
        "mmap(NULL, 2097152, PROT_READ|PROT_WRITE, "
        "MAP_PRIVATE|MAP_ANONYMOUS|MAP_HUGETLB|MAP_HUGE_2MB, -1, 0) = -1 ENOMEM (injected)\n"
    )
    (rec,) = st.tracing.records()
    assert (rec.seq, rec.op, rec.injected, rec.result.error) == (1, "mmap", True, errno.ENOMEM)


def test_every_operation_formats_like_strace(linux):
    plan = FaultPlan(
        (
            FaultRule(op="touch", signal="SIGBUS", nth=2),
            FaultRule(op="mbind", errno="EINVAL", node=3),
        )
    )
    st = instrument(linux, plan)
    k = st.kernel
    m = k.mmap(0, 8192, PRW, ANON | C["MAP_NORESERVE"] | C["MAP_POPULATE"])
    a = m.value
    assert k.madvise(a, 8192, C["MADV_POPULATE_WRITE"]).ok
    k.mbind(a, 8192, C["MPOL_BIND"] | C["MPOL_F_STATIC_NODES"], [3], 1025, C["MPOL_MF_STRICT"])
    assert k.mbind(a, 8192, C["MPOL_PREFERRED"], None, 0).ok
    assert k.touch(a, 8192, 4096).ok
    assert k.touch(a, 8192, 4096).signal == 7
    assert k.munmap(a, 8192).ok
    fd = k.memfd_create("umbp", C["MFD_CLOEXEC"] | C["MFD_HUGETLB"] | (21 << 26))
    fd2 = k.memfd_create("umbp\n4k", C["MFD_CLOEXEC"])
    assert k.ftruncate(fd2.value, 4096).ok
    assert k.close(fd2.value).ok
    assert k.close(fd2.value).error == errno.EBADF
    k.read_file("/proc/self/status")
    with pytest.raises(OSError):
        k.read_file("/nonexistent/file")
    lines = st.tracing.text().splitlines()
    status_len = st.tracing.records()[12].result.value
    assert status_len > 0
    fd_line = (
        f"= {fd.value}" if fd.ok else f"= -1 {_native.errno_name(fd.error)} ({_strerror(fd.error)})"
    )
    assert lines == [
        f"mmap(NULL, 8192, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE|"
        f"MAP_POPULATE, -1, 0) = {a:#x}",
        f"madvise({a:#x}, 8192, MADV_POPULATE_WRITE) = 0",
        f"mbind({a:#x}, 8192, MPOL_BIND|MPOL_F_STATIC_NODES, [3], 1025, MPOL_MF_STRICT)"
        " = -1 EINVAL (injected)",
        f"mbind({a:#x}, 8192, MPOL_PREFERRED, NULL, 0, 0) = 0",
        f"touch({a:#x}, 8192, 4096) = 0",
        f"touch({a:#x}, 8192, 4096) = ? +++ killed by SIGBUS +++ (injected)",
        f"munmap({a:#x}, 8192) = 0",
        f'memfd_create("umbp", MFD_CLOEXEC|MFD_HUGETLB|MFD_HUGE_2MB) {fd_line}',
        'memfd_create("umbp\\x0a4k", MFD_CLOEXEC) = ' + str(fd2.value),
        f"ftruncate({fd2.value}, 4096) = 0",
        f"close({fd2.value}) = 0",
        f"close({fd2.value}) = -1 EBADF (Bad file descriptor)",
        f'read_file("/proc/self/status") = {status_len}',
        'read_file("/nonexistent/file") = -1 ENOENT (No such file or directory)',
    ]
    if fd.ok:
        linux.close(fd.value)


def _strerror(e):
    import os

    return os.strerror(e)


@pytest.mark.parametrize(
    "flags, text",
    [
        (ANON | C["MAP_FIXED"], "MAP_PRIVATE|MAP_FIXED|MAP_ANONYMOUS"),
        (C["MAP_SHARED"] | C["MAP_ANONYMOUS"], "MAP_SHARED|MAP_ANONYMOUS"),
        (
            ANON | C["MAP_HUGETLB"] | (30 << 26),
            "MAP_PRIVATE|MAP_ANONYMOUS|MAP_HUGETLB|MAP_HUGE_1GB",
        ),
        (
            ANON | C["MAP_HUGETLB"] | (16 << 26),
            "MAP_PRIVATE|MAP_ANONYMOUS|MAP_HUGETLB|MAP_HUGE_64KB",
        ),
        (ANON | 0x400, "MAP_PRIVATE|MAP_ANONYMOUS|0x400"),
    ],
)
def test_mmap_flag_decoding(linux, flags, text):
    plan = FaultPlan((FaultRule(op="mmap", errno="ENOMEM"),))
    st = instrument(linux, plan)
    st.kernel.mmap(0x7F0000000000, 4096, C["PROT_NONE"], flags, 3, 8192)
    assert st.tracing.text() == (
        f"mmap(0x7f0000000000, 4096, PROT_NONE, {text}, 3, 8192) = -1 ENOMEM (injected)\n"
    )


def test_real_error_shows_strerror_and_is_not_injected(linux):
    st = instrument(linux)
    r = st.kernel.mmap(0, 0, PRW, ANON)
    assert r.error == errno.EINVAL
    (rec,) = st.tracing.records()
    assert not rec.injected
    assert rec.text() == (
        "mmap(NULL, 0, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0)"
        " = -1 EINVAL (Invalid argument)"
    )
    assert st.faulty is None
    assert rec.args["length"] == 0


def test_ledger_tracks_mappings_and_fds(linux):
    st = instrument(linux)
    k, t = st.kernel, st.tracing
    a = k.mmap(0, 4 * PAGE, PRW, ANON).value
    assert t.live_mappings() == [(a, 4 * PAGE)]
    # punch a hole in the middle: two pieces remain
    assert k.munmap(a + PAGE, PAGE).ok
    assert t.live_mappings() == [(a, PAGE), (a + 2 * PAGE, 2 * PAGE)]
    # MAP_FIXED over the hole replaces nothing else
    assert k.mmap(a + PAGE, PAGE, PRW, ANON | C["MAP_FIXED"]).value == a + PAGE
    assert t.live_mappings() == [(a, PAGE), (a + PAGE, PAGE), (a + 2 * PAGE, 2 * PAGE)]
    # one munmap over all of it, with an odd length rounded to pages
    assert k.munmap(a, 4 * PAGE - 100).ok
    assert t.live_mappings() == []
    fd = k.memfd_create("l", 0).value
    assert t.open_fds() == [fd]
    assert k.close(fd).ok
    assert t.open_fds() == []


def test_injected_failures_do_not_change_the_ledger(linux):
    plan = FaultPlan(
        (FaultRule(op="munmap", errno="EINVAL", nth=1), FaultRule(op="close", errno="EIO", nth=1))
    )
    st = instrument(linux, plan)
    k, t = st.kernel, st.tracing
    a = k.mmap(0, PAGE, PRW, ANON).value
    fd = k.memfd_create("l", 0).value
    assert k.munmap(a, PAGE).error == errno.EINVAL
    assert k.close(fd).error == errno.EIO
    # an injected munmap leaves the mapping; close() releases the fd whatever it reports
    assert t.live_mappings() == [(a, PAGE)] and t.open_fds() == []
    assert k.munmap(a, PAGE).ok and k.close(fd).error == errno.EBADF
    assert t.live_mappings() == [] and t.open_fds() == []


def test_limit_drops_oldest_and_trace_text_tail(linux):
    t = _native.TracingKernel(linux, 3)
    for i in range(5):
        t.close(-100 - i)
    assert t.calls == 5 and t.dropped == 2
    assert [r.seq for r in t.records()] == [3, 4, 5]
    assert trace_text(t, last=2) == (
        "... 3 earlier calls not shown\n"
        "close(-103) = -1 EBADF (Bad file descriptor)\n"
        "close(-104) = -1 EBADF (Bad file descriptor)\n"
    )
    t.clear()
    assert t.records() == [] and t.dropped == 0 and trace_text(t) == ""
    assert trace_text(linux) == ""


def test_find_layer_walks_the_chain(linux):
    st = instrument(linux, FaultPlan())
    assert find_layer(st.kernel, _native.FaultyKernel) is st.faulty
    assert find_layer(st.kernel, _native.LinuxKernel) is not None
    assert st.faulty.inner is not None and st.tracing.inner is not None


def test_crash_info_of_a_real_kernel_stack_is_none(linux):
    st = instrument(linux, FaultPlan())
    assert st.kernel.crash_info() is None and st.faulty.crash_info() is None
