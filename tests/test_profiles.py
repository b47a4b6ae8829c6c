"""The allocator's two profiles: mori-624002c does what mori's allocator does in the field
(docs/deployed-behaviour.md, each row), umbp-sim keeps its fixes. Both on SimKernel."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging

import pytest

import umbp_sim
from umbp_sim.allocator import (
    Anonymous,
    AnonymousHugetlb,
    AnonymousShm,
    AnonymousShmHugetlb,
    MoriUMBPHostMemAllocator,
    UMBPHostMemAllocator,
)
from umbp_sim.allocator_profiles import (
    DIFFERENCES,
    ProfileError,
    canonical_profile,
    difference_table,
    mori_log_lines,
)
from umbp_sim.cli import main
from umbp_sim.errors import SimulatedCrash
from umbp_sim.faults import FaultPlan, FaultRule
from umbp_sim.host.leaks import collect_leaks
from umbp_sim.host.trace import instrument, trace_text
from umbp_sim.machine import Machine
from umbp_sim.scenario.bundled import bundled_scenarios_dir
from umbp_sim.scenario.scenario_run import run_scenario
from umbp_sim.scenario.schema import find_scenarios, load_scenario
from umbp_sim.sim import SimHost, build_kernel

MiB = 1 << 20
MORI = "mori-624002c"
PER_NODE = Machine.x86_64(
    nodes=2, mem_per_node="64GiB", hugepages_per_node=[{"2MiB": 1024}, {}], kernel_version="6.8.0"
)


def _trace(st) -> list[str]:
    return trace_text(st.kernel).splitlines()


@pytest.fixture
def sim(caplog):
    caplog.set_level(logging.INFO, logger="umbp_sim.allocator")

    def make(profile, *rules, machine=None, cls=UMBPHostMemAllocator):
        m = machine or Machine.x86_64(hugepages={"2MiB": 16})
        host = SimHost(m, build_kernel(m))
        st = instrument(host.kernel, FaultPlan(tuple(rules)))
        alloc = cls(st.kernel, profile)
        caplog.clear()

        def warnings():
            return [r.getMessage() for r in caplog.records if r.name == "umbp_sim.allocator"]

        return host, st, alloc, warnings

    return make


def test_profile_names():
    assert canonical_profile("mori") == MORI
    assert canonical_profile("umbp-sim") == "umbp-sim"
    with pytest.raises(ProfileError, match="unknown allocator profile 'x'"):
        canonical_profile("x")
    with pytest.raises(ValueError, match="unknown allocator profile 'x'"):
        UMBPHostMemAllocator(umbp_sim.allocator.real_kernel(), "x")
    assert UMBPHostMemAllocator(umbp_sim.allocator.real_kernel(), "mori").profile == MORI


def test_difference_table_names_every_difference_with_moris_lines():
    assert len(DIFFERENCES) >= 10
    table = difference_table().splitlines()
    assert table[0].split() == ["decision", "umbp-sim", MORI, "mori", "source", "(lines)"]
    for d, line in zip(DIFFERENCES, table[1:], strict=True):
        assert line.startswith(d.decision)
        assert d.umbp_sim in line and d.mori in line and line.endswith(d.mori_lines)
        assert d.umbp_sim != d.mori


def test_profiles_command(capsys):
    assert main(["profiles"]) == 0
    assert "after a failed MADV_POPULATE_WRITE" in capsys.readouterr().out
    assert main(["profiles", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["decision"] for r in rows] == [d.decision for d in DIFFERENCES]
    assert main(["run", "--allocator", "no such allocator"]) == 64


# ---- row 1: POPULATE EFAULT on hugetlb ----------------------------------------------------------
def test_headline_per_node_case_sigbus_in_mori_demoted_in_umbp_sim(sim):
    host, st, alloc, warnings = sim(MORI, machine=PER_NODE)
    with pytest.raises(SimulatedCrash) as e:
        alloc.alloc(1 << 30, AnonymousHugetlb, numa_node=1)
    assert e.value.signal == "SIGBUS" and e.value.node == 1
    assert warnings() == [
        "HostMemAllocator: madvise(MADV_POPULATE_WRITE) failed (14: Bad address); falling back "
        "to manual page touching"
    ]
    trace = _trace(st)
    assert "MADV_POPULATE_WRITE) = -1 EFAULT" in trace[-2] and trace[-1].startswith("touch(")

    host, st, alloc, warnings = sim("umbp-sim", machine=PER_NODE)
    h = alloc.alloc(1 << 30, AnonymousHugetlb, numa_node=1)
    assert h.actual_backing == Anonymous
    alloc.free(h)
    assert collect_leaks(host, alloc, st.kernel) == []


# ---- row 2: other POPULATE errors ---------------------------------------------------------------
@pytest.mark.parametrize(
    "errno, number, text",
    [("ENOMEM", 12, "Cannot allocate memory"), ("EINTR", 4, "Interrupted system call")],
)
def test_other_populate_errors_touch_by_hand_and_keep_the_buffer(sim, errno, number, text):
    host, st, alloc, warnings = sim(MORI, FaultRule(op="madvise", errno=errno, nth=1))
    h = alloc.alloc(8 * MiB, Anonymous)
    assert h and h.actual_backing == Anonymous
    assert warnings() == [
        f"HostMemAllocator: madvise(MADV_POPULATE_WRITE) failed ({number}: {text}); falling "
        "back to manual page touching"
    ]
    alloc.free(h)
    host, st, alloc, warnings = sim("umbp-sim", FaultRule(op="madvise", errno=errno, nth=1))
    assert not alloc.alloc(8 * MiB, Anonymous)


# ---- row 3: no node list ------------------------------------------------------------------------
def test_mori_binds_without_the_possible_node_list(sim):
    rule = FaultRule(op="read_file", path="/sys/devices/system/node/possible", errno="ENOENT")
    two = Machine.x86_64(nodes=2, hugepages={"2MiB": 16})
    host, st, alloc, warnings = sim(MORI, rule, machine=two)
    h = alloc.alloc(4 * MiB, Anonymous, numa_node=1)
    assert h.numa_node == 1 and warnings() == []
    alloc.free(h)
    host, st, alloc, warnings = sim("umbp-sim", rule, machine=two)
    h = alloc.alloc(4 * MiB, Anonymous, numa_node=1)
    assert h.numa_node == -1 and "cannot be read (ENOENT)" in warnings()[0]
    alloc.free(h)


# ---- rows 4 and 5: maxnode and the nodemask -----------------------------------------------------
def test_node_63_is_never_bound_by_mori(sim):
    wide = Machine.x86_64(nodes=64, mem_per_node="1GiB")
    host, st, alloc, warnings = sim(MORI, machine=wide)
    h = alloc.alloc(MiB, Anonymous, numa_node=63)
    assert h and h.numa_node == -1
    assert warnings() == ["HostMemAllocator: mbind(node=63) failed (22: Invalid argument)"]
    # the kernel reads maxnode-1 = 63 bits: the mask it sees is empty
    assert "MPOL_BIND, [], 64, 0) = -1 EINVAL" in "\n".join(_trace(st))
    alloc.free(h)
    host, st, alloc, warnings = sim("umbp-sim", machine=wide)
    h = alloc.alloc(MiB, Anonymous, numa_node=63)
    assert h.numa_node == 63
    alloc.free(h)


def test_huge_node_builds_the_mask_and_fails_in_mbind(sim):
    host, st, alloc, warnings = sim(MORI)
    h = alloc.alloc(MiB, Anonymous, numa_node=2**31 - 1)
    assert h and warnings() == [
        "HostMemAllocator: mbind(node=2147483647) failed (22: Invalid argument)"
    ]
    # the 256 MiB mask was taken from mmap (as malloc would) and given back
    assert any("mmap(NULL, 268435456" in line for line in _trace(st))
    alloc.free(h)
    assert collect_leaks(host, alloc, st.kernel) == []


def test_huge_node_under_a_memory_limit_escapes_as_memory_error_and_leaks(sim):
    # RLIMIT_AS below the buffer plus the 256 MiB mask: malloc's mmap of the mask is refused and
    # std::bad_alloc escapes alloc (mori), while umbp-sim's allocator builds no mask.
    limited = dataclasses.replace(Machine.x86_64(hugepages={"2MiB": 16}), rlimit_as=128 * MiB)
    host, st, alloc, warnings = sim(MORI, machine=limited)
    with pytest.raises(MemoryError):
        alloc.alloc(MiB, Anonymous, numa_node=2**31 - 1)
    assert any("still mapped" in leak for leak in collect_leaks(host))  # the buffer leaked
    host, st, alloc, warnings = sim("umbp-sim", machine=limited)
    h = alloc.alloc(MiB, Anonymous, numa_node=2**31 - 1)
    assert h and h.numa_node == -1
    alloc.free(h)
    assert collect_leaks(host, alloc, st.kernel) == []


def test_the_masks_mmap_and_munmap_are_the_c_librarys_not_the_fault_plans(sim):
    """glibc's malloc maps the 256 MiB mask with its internal mmap, which a real build's fault
    plan never sees: the plan's first munmap is Free's, and a rule for large mmaps never fires
    (as measured on a build of mori 624002c under the interposer)."""
    big_mmap = FaultRule(op="mmap", errno="ENOMEM", min_length=256 * MiB)
    host, st, alloc, warnings = sim(MORI, FaultRule(op="munmap", errno="EINVAL", nth=1), big_mmap)
    h = alloc.alloc(MiB, Anonymous, numa_node=2**31 - 1)
    assert h and st.faulty.fires(1) == 0
    assert any("mmap(NULL, 268435456" in line for line in _trace(st))  # the host served it
    alloc.free(h)
    assert warnings()[-1] == (
        "HostMemAllocator: munmap failed (22: Invalid argument); invalidating handle anyway to "
        "prevent a possible double-free of a reused VA range"
    )
    assert st.faulty.fires(0) == 1


# ---- row 6 and hugepage sizes up to the base page -----------------------------------------------
def test_hugepage_size_4096_asks_the_kernel_under_mori(sim):
    host, st, alloc, warnings = sim(MORI)
    h = alloc.alloc(MiB, AnonymousHugetlb, hugepage_size=4096)
    assert h.actual_backing == Anonymous
    assert warnings() == [
        "HostMemAllocator: MAP_HUGETLB allocation failed for size=1048576 hugepage_size=4096 "
        "(22: Invalid argument); falling back to anonymous pages. HugePages_Total:      16 "
        "HugePages_Free:       16 Hugepagesize:       2048 kB"
    ]
    assert any("MAP_HUGETLB" in line for line in _trace(st))
    alloc.free(h)
    host, st, alloc, warnings = sim("umbp-sim")
    h = alloc.alloc(MiB, AnonymousHugetlb, hugepage_size=4096)
    assert h.actual_backing == Anonymous
    assert not any("MAP_HUGETLB" in line for line in _trace(st))  # never asked
    alloc.free(h)


def test_hugepage_size_one_maps_default_hugepages_and_leaks_at_free(sim):
    host, st, alloc, warnings = sim(MORI)
    h = alloc.alloc(1000000, AnonymousHugetlb, hugepage_size=1)
    assert h.actual_backing == AnonymousHugetlb
    assert (h.mapped_size, h.actual_alignment) == (1000000, 1)
    assert host.hugepages(2 * MiB).free == 15
    alloc.free(h)
    assert not h
    assert warnings()[-1].startswith("HostMemAllocator: munmap failed (22: Invalid argument)")
    assert host.hugepages(2 * MiB).free == 15  # the hugepage stays mapped


# ---- the once flag, texts, silence --------------------------------------------------------------
def test_one_hugetlb_warning_per_process_for_every_backing_size_and_errno(sim):
    host, st, alloc, warnings = sim(MORI, machine=Machine.x86_64())
    handles = [
        alloc.alloc(MiB, AnonymousHugetlb),
        alloc.alloc(MiB, AnonymousShmHugetlb),
        alloc.alloc(4 * MiB, AnonymousHugetlb, hugepage_size=1 << 30),
    ]
    assert [h.actual_backing for h in handles] == [Anonymous, AnonymousShm, Anonymous]
    assert len(warnings()) == 1 and "MAP_HUGETLB allocation failed" in warnings()[0]
    # a second allocator on the same kernel (process) is silent too: the flag is process-wide
    other = UMBPHostMemAllocator(st.kernel, MORI)
    handles.append(other.alloc(MiB, AnonymousHugetlb))
    assert len(warnings()) == 1
    for h in handles:
        alloc.free(h)


def test_mori_is_silent_where_umbp_sim_explains(sim):
    rule = FaultRule(op="mmap", errno="ENOMEM", nth=1)
    host, st, alloc, warnings = sim(MORI, rule)
    assert not alloc.alloc(0, Anonymous)
    assert not alloc.alloc(2**64 - 1, AnonymousHugetlb)
    assert not alloc.alloc(MiB, Anonymous)  # the injected mmap failure
    assert warnings() == []
    host, st, alloc, warnings = sim("umbp-sim", rule)
    assert not alloc.alloc(0, Anonymous)
    assert not alloc.alloc(MiB, Anonymous)
    assert len(warnings()) == 2


def test_mori_log_level():
    lines = ["HostMemAllocator: x"]
    assert mori_log_lines(lines, {}) == []
    assert mori_log_lines(lines, {"MORI_UMBP_LOG_LEVEL": "error"}) == []
    shown = ["[<time>] [<pid>] [umbp] [warning] HostMemAllocator: x"]
    assert mori_log_lines(lines, {"MORI_UMBP_LOG_LEVEL": "warn"}) == shown
    assert mori_log_lines(lines, {"MORI_GLOBAL_LOG_LEVEL": "INFO"}) == shown
    # the module's own variable wins over the global one; unknown names read as error
    assert (
        mori_log_lines(lines, {"MORI_UMBP_LOG_LEVEL": "bogus", "MORI_GLOBAL_LOG_LEVEL": "debug"})
        == []
    )  # noqa: E501


# ---- row 7 and 8: free trusts the handle --------------------------------------------------------
def test_stale_copy_of_a_shm_handle_takes_the_new_buffers_registry_record(sim):
    host, st, alloc, warnings = sim(MORI)
    first = alloc.alloc(MiB, AnonymousShm)
    stale = copy.copy(first)
    alloc.free(first)
    second = alloc.alloc(MiB, AnonymousShm)
    if second.ptr != stale.ptr:
        pytest.fail("the simulated kernel did not reuse the address (test precondition)")
    assert alloc.snapshot()["shm"] and alloc.snapshot()["live"]
    alloc.free(stale)  # mori: unmaps the new buffer and closes its fd
    assert alloc.snapshot() == {"live": [], "shm": []}
    assert any(line.startswith("close(") for line in _trace(st)[-2:])
    # umbp-sim refuses the stale copy and keeps the live buffer
    host, st, alloc, warnings = sim("umbp-sim")
    first = alloc.alloc(MiB, AnonymousShm)
    stale = copy.copy(first)
    alloc.free(first)
    second = alloc.alloc(MiB, AnonymousShm)
    alloc.free(stale)
    assert "which no allocator on this kernel owns" in warnings()[-1]
    assert len(alloc.snapshot()["live"]) == 1
    alloc.free(second)


# ---- row 9 and 10: mori's Python binding --------------------------------------------------------
def test_moris_python_binding_conversions(sim):
    host, st, alloc, warnings = sim(MORI, cls=MoriUMBPHostMemAllocator)
    h = alloc.alloc(True)  # pybind takes True as 1
    assert h and h.requested_size == 1
    alloc.free(h)
    h = alloc.alloc(4096, Anonymous, prefault=None)  # None is False: no madvise
    assert h and not any("madvise" in line for line in _trace(st)[-2:])
    alloc.free(h)
    for bad in ({"size": -1}, {"size": 2**64}, {"size": 1.0}, {"size": 1, "numa_node": 2**31}):
        with pytest.raises(TypeError):
            alloc.alloc(**bad)
    for name in ("lookup_shm_allocation", "acquire_shm_allocation", "release_shm_allocation"):
        assert not hasattr(alloc, name)
    strict = UMBPHostMemAllocator(st.kernel)
    with pytest.raises(TypeError):
        strict.alloc(True)


# ---- mori's own Python tests (tests/python/umbp/test_umbp_host_mem_allocator.py), on the real
# kernel through mori_compat: the same assertions, written here.
def _touch(handle, value):
    import ctypes

    data = (ctypes.c_ubyte * handle.requested_size).from_address(handle.ptr)
    data[0] = data[handle.requested_size - 1] = value
    assert data[0] == value and data[handle.requested_size - 1] == value


def test_moris_own_tests_pass_on_the_mori_profile():
    import os

    with umbp_sim.mori_compat.mori_umbp() as umbp:
        assert umbp.__umbp_sim_profile__ == MORI
        B = umbp.UMBPHostBufferBacking
        a = umbp.UMBPHostMemAllocator()
        page = os.sysconf("SC_PAGE_SIZE")
        h = a.alloc(12345, B.Anonymous, hugepage_size=2 * MiB, numa_node=-1, prefault=True)
        assert h and h.ptr and h.requested_size == 12345
        assert h.actual_backing == B.Anonymous and h.actual_alignment == page
        assert h.mapped_size >= 12345 and h.mapped_size % page == 0 and h.ptr % page == 0
        _touch(h, 0x5A)
        a.free(h)
        assert not h and h.ptr == 0 and h.requested_size == 0 and h.mapped_size == 0
        h = a.alloc(64 * 1024, B.AnonymousHugetlb, hugepage_size=2 * MiB, numa_node=-1)
        assert h and h.actual_backing in (B.Anonymous, B.AnonymousHugetlb)
        align = 2 * MiB if h.actual_backing == B.AnonymousHugetlb else page
        assert h.actual_alignment == align and h.ptr % align == 0
        _touch(h, 0xA5)
        a.free(h)
        assert not h
        h = a.alloc(4096)
        a.free(h)
        a.free(h)  # idempotent
        assert not h and h.requested_size == 0 and h.mapped_size == 0


# ---- scenarios: each states its profile where the profiles differ -------------------------------
def _library():
    return [load_scenario(p) for p in find_scenarios([bundled_scenarios_dir()])]


def test_every_scenario_naming_no_profile_passes_under_both():
    unnamed = [s for s in _library() if s.allocator is None and s.request_kind != "sglang"]
    assert len(unnamed) >= 10
    for scn in unnamed:
        for profile in ("umbp-sim", MORI):
            r = run_scenario(scn, profile)
            assert r.passed, f"{profile}: {r.report()}"


@pytest.mark.torch
def test_every_sglang_scenario_naming_no_profile_passes_under_both():
    unnamed = [s for s in _library() if s.allocator is None and s.request_kind == "sglang"]
    assert unnamed
    for scn in unnamed:
        for profile in ("umbp-sim", MORI):
            r = run_scenario(scn, profile)
            assert r.passed, f"{profile}: {r.report()}"


def test_the_library_has_mori_twins_of_the_field_cases():
    named = {s.name: s for s in _library()}
    mori = named["per-node-exhaustion-sigbus"]
    fixed = named["per-node-exhaustion-populate-efault"]
    assert (mori.allocator, fixed.allocator) == (MORI, "umbp-sim")
    assert mori.request == fixed.request
    assert mori.expect["outcome"] == "crashed" and fixed.expect["outcome"] == "demoted"
    # and a scenario's own profile wins over the runner's
    flipped = dataclasses.replace(fixed, allocator=None)
    assert not run_scenario(flipped, MORI).passed
    assert run_scenario(fixed, MORI).passed


# ---- mori's texts on the remaining paths ----------------------------------------------------
@pytest.mark.parametrize(
    "backing, to, tail",
    [
        (AnonymousHugetlb, Anonymous, "falling back to anonymous pages"),
        (AnonymousShmHugetlb, AnonymousShm, "falling back to AnonymousShm (4 KiB pages)"),
    ],
)
def test_mori_invalid_hugepage_size_is_said_every_time(sim, backing, to, tail):
    host, st, alloc, warnings = sim(MORI)
    handles = [alloc.alloc(MiB, backing, hugepage_size=3 * MiB) for _ in range(2)]
    assert [h.actual_backing for h in handles] == [to, to]
    assert warnings() == [f"HostMemAllocator: invalid hugepage_size=3145728; {tail}"] * 2
    for h in handles:
        alloc.free(h)


def test_mori_shm_step_failures(sim):
    rules = [
        FaultRule(op="ftruncate", errno="EFBIG", nth=1),
        FaultRule(op="memfd_create", errno="EMFILE", nth=2),
        FaultRule(op="mmap", errno="ENOMEM", nth=1),
    ]
    host, st, alloc, warnings = sim(MORI, *rules)
    # ShmHugetlb: ftruncate fails (said every time), then AnonymousShm's memfd_create fails
    assert not alloc.alloc(4 * MiB, AnonymousShmHugetlb)
    assert warnings() == [
        "HostMemAllocator: ftruncate(hugetlb memfd, 4194304) failed (27: File too large)",
        "HostMemAllocator: memfd_create failed (24: Too many open files)",
    ]
    assert not alloc.alloc(MiB, AnonymousShm)  # the mmap of the memfd fails
    assert (
        warnings()[-1]
        == "HostMemAllocator: mmap(memfd, 1048576) failed (12: Cannot allocate memory)"
    )  # noqa: E501
    assert collect_leaks(host, alloc, st.kernel) == []


def test_mori_shm_ftruncate_failure_without_hugepages(sim):
    host, st, alloc, warnings = sim(MORI, FaultRule(op="ftruncate", errno="ENOSPC", nth=1))
    assert not alloc.alloc(MiB, AnonymousShm)
    assert warnings() == [
        "HostMemAllocator: ftruncate(memfd, 1048576) failed (28: No space left on device)"
    ]
    assert collect_leaks(host, alloc, st.kernel) == []


def test_mori_numa_unavailable_once(sim):
    host, st, alloc, warnings = sim(MORI, FaultRule(op="mbind", errno="ENOSYS"))
    handles = [alloc.alloc(MiB, Anonymous, numa_node=0) for _ in range(2)]
    assert all(h and h.numa_node == -1 for h in handles)
    assert warnings() == [
        "HostMemAllocator: NUMA binding unavailable on this build; ignoring numa_node"
    ]
    for h in handles:
        alloc.free(h)


def test_mori_deferred_free_and_release(sim):
    host, st, alloc, warnings = sim(MORI, FaultRule(op="munmap", errno="EINVAL", nth=1))
    h = alloc.alloc(MiB, AnonymousShm)
    base = h.ptr
    assert alloc.acquire_shm_allocation(base, 1) is not None
    alloc.free(h)
    assert warnings()[-1] == (
        f"HostMemAllocator: freeing AnonymousShm buffer ptr={base:#x} while 1 active "
        "registration(s) still reference it; deferring munmap/close until deregistration"
    )
    alloc.release_shm_allocation(base)  # the deferred munmap fails (injected)
    assert warnings()[-1] == "HostMemAllocator: deferred munmap failed (22: Invalid argument)"
    n = len(warnings())
    alloc.release_shm_allocation(base)  # unknown now: mori says nothing
    alloc.release_shm_allocation(12345)
    assert len(warnings()) == n
