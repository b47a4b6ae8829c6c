"""FaultyKernel over the real kernel: schedules, filters, composition, records, no host harm."""

from __future__ import annotations

import errno
import signal

import pytest

from umbp_sim import _native
from umbp_sim.faults import FaultPlan, FaultRule

C = _native.constants
PRW = C["PROT_READ"] | C["PROT_WRITE"]
ANON = C["MAP_PRIVATE"] | C["MAP_ANONYMOUS"]
HUGE_2M = C["MAP_HUGETLB"] | (21 << 26)
PAGE = 4096


@pytest.fixture
def linux():
    return _native.LinuxKernel()


def mmap_series(k, n, flags=ANON, length=PAGE):
    """n anonymous mmaps; real ones are unmapped again. Returns the errno per call (0 = ok)."""
    out = []
    for _ in range(n):
        r = k.mmap(0, length, PRW, flags)
        if r.ok:
            assert _native.LinuxKernel().munmap(r.value, length).ok
        out.append(r.error)
    return out


def fired(results):
    return [i + 1 for i, e in enumerate(results) if e]


@pytest.mark.parametrize(
    "kw, expected",
    [
        ({"nth": 3}, [3]),
        ({"calls": (2, 4)}, [2, 3, 4]),
        ({"every": 3}, [3, 6, 9]),
        ({"first": 2}, [1, 2]),
        ({"every": 2, "max_fires": 2}, [2, 4]),
        ({}, list(range(1, 11))),
        ({"first": 0}, []),
    ],
)
def test_schedules(linux, kw, expected):
    fk = FaultPlan((FaultRule(op="mmap", errno="ENOMEM", **kw),)).wrap(linux)
    res = mmap_series(fk, 10)
    assert fired(res) == expected
    assert set(res) <= {0, errno.ENOMEM}
    assert fk.calls(0) == 10
    assert fk.fires(0) == len(expected)
    assert [r.call for r in fk.records()] == expected


def test_probability_is_a_function_of_the_seed(linux):
    def run(seed):
        plan = FaultPlan((FaultRule(op="mmap", errno="ENOMEM", probability=0.3),), seed=seed)
        return fired(mmap_series(plan.wrap(linux), 200))

    a, b, c = run(7), run(7), run(8)
    assert a == b
    assert a != c
    assert 30 <= len(a) <= 90  # 0.3 of 200, loosely
    # a rule's own seed overrides the plan's
    own = FaultPlan((FaultRule(op="mmap", errno="ENOMEM", probability=0.3, seed=7),), seed=99)
    assert fired(mmap_series(own.wrap(linux), 200)) == a


def test_probability_edges(linux):
    never = FaultPlan((FaultRule(op="mmap", errno="ENOMEM", probability=0.0),)).wrap(linux)
    assert fired(mmap_series(never, 20)) == []
    always = FaultPlan((FaultRule(op="mmap", errno="ENOMEM", probability=1.0),)).wrap(linux)
    assert len(fired(mmap_series(always, 20))) == 20


def test_mmap_flag_and_length_filters_do_not_count_other_calls(linux):
    rule = FaultRule(op="mmap", errno="ENOMEM", flags_has=("MAP_HUGETLB", "MAP_HUGE_2MB"), nth=2)
    fk = FaultPlan((rule,)).wrap(linux)
    # plain anonymous mmaps are neither counted nor failed
    assert fired(mmap_series(fk, 5)) == []
    assert fk.calls(0) == 0
    # hugetlb ones are: the 1st goes to the real kernel (ENOMEM there only if no pages), the 2nd
    # is injected
    r1 = fk.mmap(0, 2 << 20, PRW, ANON | HUGE_2M)
    if r1.ok:
        linux.munmap(r1.value, 2 << 20)
    r2 = fk.mmap(0, 2 << 20, PRW, ANON | HUGE_2M)
    assert r2.error == errno.ENOMEM
    assert fk.calls(0) == 2 and fk.fires(0) == 1
    # MAP_HUGE_1GB is a different size: not matched
    r3 = fk.mmap(0, 1 << 30, PRW, ANON | C["MAP_HUGETLB"] | (30 << 26) | C["MAP_NORESERVE"])
    if r3.ok:
        linux.munmap(r3.value, 1 << 30)
    assert fk.calls(0) == 2


def test_flags_lacks_type_and_length_bounds(linux):
    plan = FaultPlan(
        (
            FaultRule(
                op="mmap",
                errno="EPERM",
                flags_has=("MAP_PRIVATE",),
                flags_lacks=("MAP_NORESERVE",),
                min_length=8192,
                max_length=1 << 20,
            ),
        )
    )
    fk = plan.wrap(linux)
    assert fired(mmap_series(fk, 1, length=4096)) == []  # too short
    assert fired(mmap_series(fk, 1, length=2 << 20)) == []  # too long
    assert fired(mmap_series(fk, 1, length=8192, flags=ANON | C["MAP_NORESERVE"])) == []
    shared = C["MAP_SHARED"] | C["MAP_ANONYMOUS"]
    assert fired(mmap_series(fk, 1, length=8192, flags=shared)) == []
    assert mmap_series(fk, 1, length=8192) == [errno.EPERM]
    assert fk.calls(0) == 1


def test_injected_munmap_does_not_unmap(linux):
    fk = FaultPlan((FaultRule(op="munmap", errno="EINVAL", nth=1),)).wrap(linux)
    r = fk.mmap(0, PAGE, PRW, ANON)
    assert r.ok
    assert fk.munmap(r.value, PAGE).error == errno.EINVAL
    # still mapped: touching it is fine, and the real munmap succeeds
    assert fk.touch(r.value, PAGE, PAGE).ok
    assert fk.munmap(r.value, PAGE).ok


def test_madvise_advice_filter_and_signal(linux):
    plan = FaultPlan(
        (
            FaultRule(op="madvise", errno="EINVAL", advice="MADV_POPULATE_WRITE", nth=1),
            FaultRule(op="madvise", signal="SIGBUS", advice="MADV_POPULATE_WRITE"),
        )
    )
    fk = plan.wrap(linux)
    r = linux.mmap(0, PAGE, PRW, ANON)
    try:
        assert fk.madvise(r.value, PAGE, C["MADV_DONTNEED"]).ok
        first = fk.madvise(r.value, PAGE, C["MADV_POPULATE_WRITE"])
        assert (first.error, first.signal) == (errno.EINVAL, 0)
        second = fk.madvise(r.value, PAGE, C["MADV_POPULATE_WRITE"])
        assert (second.value, second.error, second.signal) == (-1, 0, signal.SIGBUS)
        assert not second.ok
        # the first rule counted both populate calls, fired once; the second only won the 2nd
        assert (fk.calls(0), fk.fires(0), fk.calls(1), fk.fires(1)) == (2, 1, 2, 1)
    finally:
        linux.munmap(r.value, PAGE)


def test_first_firing_rule_wins_and_others_keep_counting(linux):
    plan = FaultPlan(
        (
            FaultRule(op="mmap", errno="ENOMEM", every=2),
            FaultRule(op="mmap", errno="EINVAL", every=3),
        )
    )
    fk = plan.wrap(linux)
    res = mmap_series(fk, 6)
    assert res == [0, errno.ENOMEM, errno.EINVAL, errno.ENOMEM, 0, errno.ENOMEM]
    assert [(r.rule, r.call) for r in fk.records()] == [(0, 2), (1, 3), (0, 4), (0, 6)]
    assert (fk.calls(0), fk.calls(1), fk.fires(1)) == (6, 6, 1)  # call 6 of rule 1 lost to rule 0


def test_mbind_node_and_mode_filters(linux):
    fk = FaultPlan((FaultRule(op="mbind", errno="EINVAL", node=3, mode="MPOL_BIND"),)).wrap(linux)
    r = linux.mmap(0, PAGE, PRW, ANON)
    try:
        ok = fk.mbind(r.value, PAGE, C["MPOL_BIND"], [0], 2)
        assert ok.ok  # node 0 exists on every host
        assert fk.mbind(r.value, PAGE, C["MPOL_BIND"], [0, 3], 5).error == errno.EINVAL
        # maxnode=4 hides bit 3 (the kernel reads maxnode-1 bits): not node 3's call
        assert fk.mbind(r.value, PAGE, C["MPOL_BIND"], [0, 3], 4).ok
        fk.mbind(r.value, PAGE, C["MPOL_PREFERRED"], [3], 5)  # other mode: real kernel answers
        assert fk.calls(0) == 1 and len(fk.records()) == 1
        rec = fk.records()[0]
        assert rec.op == "mbind"
        assert rec.args["nodes"] == [0, 3]
        assert rec.call_text == f"mbind({r.value:#x}, 4096, MPOL_BIND, [0,3], 5, 0)"
    finally:
        linux.munmap(r.value, PAGE)


def test_memfd_ftruncate_close_read_file_touch(linux):
    plan = FaultPlan(
        (
            FaultRule(op="memfd_create", errno="EINVAL", memfd_flags_has=("MFD_HUGETLB",)),
            FaultRule(op="ftruncate", errno="EINVAL", min_length=1 << 20),
            FaultRule(op="close", errno="EIO", nth=1),
            FaultRule(op="read_file", errno="ENOENT", path="/sys/kernel/mm/hugepages/*"),
            FaultRule(op="touch", signal="SIGBUS", nth=2),
        )
    )
    fk = plan.wrap(linux)
    assert fk.memfd_create("x", C["MFD_CLOEXEC"] | C["MFD_HUGETLB"]).error == errno.EINVAL
    fd = fk.memfd_create("x", C["MFD_CLOEXEC"])
    assert fd.ok
    assert fk.ftruncate(fd.value, 2 << 20).error == errno.EINVAL
    assert fk.ftruncate(fd.value, 4096).ok
    # injected EIO: as on Linux the descriptor is released all the same
    assert fk.close(fd.value).error == errno.EIO
    assert fk.close(fd.value).error == errno.EBADF
    with pytest.raises(OSError) as e:
        fk.read_file("/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages")
    assert e.value.errno == errno.ENOENT
    assert fk.read_file("/proc/self/stat")  # other paths pass through
    m = linux.mmap(0, PAGE, PRW, ANON)
    try:
        assert fk.touch(m.value, PAGE, PAGE).ok
        assert fk.touch(m.value, PAGE, PAGE).signal == signal.SIGBUS
    finally:
        linux.munmap(m.value, PAGE)
    recs = fk.records()
    assert [(r.rule, r.op, r.errno_name, r.signal_name) for r in recs] == [
        (0, "memfd_create", "EINVAL", ""),
        (1, "ftruncate", "EINVAL", ""),
        (2, "close", "EIO", ""),
        (3, "read_file", "ENOENT", ""),
        (4, "touch", "", "SIGBUS"),
    ]
    assert recs[0].args == {"name": "x", "flags": C["MFD_CLOEXEC"] | C["MFD_HUGETLB"]}
    assert recs[0].call_text == 'memfd_create("x", MFD_CLOEXEC|MFD_HUGETLB)'


def test_record_names_and_reset(linux):
    fk = FaultPlan((FaultRule(op="mmap", errno="ENOMEM", name="no memory", nth=1),)).wrap(linux)
    mmap_series(fk, 2)
    (rec,) = fk.records()
    assert (rec.rule, rec.rule_name, rec.call, rec.op, rec.error) == (0, "no memory", 1, "mmap", 12)
    assert rec.args == {"addr": 0, "length": 4096, "prot": 3, "flags": ANON, "fd": -1, "offset": 0}
    assert repr(rec) == (
        "<FaultRecord rule 0 (no memory) call 1: "
        "mmap(NULL, 4096, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0) -> ENOMEM>"
    )
    fk.reset()
    assert fk.records() == [] and fk.calls(0) == 0
    assert fired(mmap_series(fk, 2)) == [1]


def test_native_rule_errors(linux):
    r = _native.FaultRule()
    r.op = "read_file"
    r.signal = signal.SIGBUS
    r.name = "x"
    with pytest.raises(ValueError, match=r"^fault rule 0 \(x\): read_file cannot be answered"):
        _native.FaultyKernel(linux, [r])
    r.signal = 0
    with pytest.raises(
        ValueError, match="needs exactly one of an errno, a signal, content or a throw"
    ):
        _native.FaultyKernel(linux, [r])
    with pytest.raises(ValueError, match="unknown operation 'brk'"):
        r.op = "brk"
    with pytest.raises(IndexError):
        _native.FaultyKernel(linux, []).calls(0)


def test_page_size_passes_through(linux):
    assert FaultPlan().wrap(linux).page_size() == linux.page_size()


@pytest.mark.threads
def test_threads_fire_the_same_number_of_times(linux):
    import threading

    fk = FaultPlan((FaultRule(op="mmap", errno="ENOMEM", every=5),)).wrap(linux)

    def work():
        mmap_series(fk, 100)

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert fk.calls(0) == 400
    assert sorted(r.call for r in fk.records()) == list(range(5, 401, 5))


def test_read_file_content_and_signal_in_any_call(linux):
    plan = FaultPlan(
        (
            FaultRule(op="read_file", content="0-3\n", path="/sys/devices/system/node/possible"),
            FaultRule(op="mmap", signal="SIGKILL", nth=1),
        )
    )
    fk = plan.wrap(linux)
    assert fk.read_file("/sys/devices/system/node/possible") == "0-3\n"
    r = fk.mmap(0, PAGE, PRW, ANON)
    assert (r.value, r.error, r.signal) == (-1, 0, signal.SIGKILL)
    assert [(x.op, x.signal_name) for x in fk.records()] == [("read_file", ""), ("mmap", "SIGKILL")]


def test_throw_bad_alloc_is_recorded_and_traced(linux):
    from umbp_sim.host.trace import instrument

    st = instrument(linux, FaultPlan((FaultRule(op="close", throw="bad_alloc", nth=1),)))
    with pytest.raises(MemoryError):
        st.kernel.close(-1)
    assert st.kernel.close(-1).error == errno.EBADF
    (rec,) = st.faulty.records()
    assert rec.threw and rec.call == 1
    assert repr(rec) == "<FaultRecord rule 0 call 1: close(-1) -> throw std::bad_alloc>"
    first, second = st.tracing.records()
    assert first.threw and first.injected and not second.threw
    assert first.text() == "close(-1) = ? (threw std::bad_alloc) (injected)"
