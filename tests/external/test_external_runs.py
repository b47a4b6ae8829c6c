"""An external allocator (tests/external/tiny_allocator.cpp) run through both attach modes on
SimKernel and under fault plans: outcomes as data, one forked process per run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from umbp_sim.allocator_spec import parse_allocator_spec
from umbp_sim.comparison.matrix import machine
from umbp_sim.engine.spec import Alloc, Run as EngineRun
from umbp_sim.external.interposer import FAULT_PATH_ENV
from umbp_sim.external.runner import CouldNotRun
from umbp_sim.faults import FaultPlan
from umbp_sim.machine import Machine
from umbp_sim.request import AllocRequest as AllocCall
from umbp_sim.run_router import ExternalAllocator, open_allocator

MiB = 1 << 20


@pytest.fixture(
    scope="module",
    params=[("preload", "uffd"), ("preload", "sigsegv"), ("wrap", "uffd"), ("wrap", "sigsegv")],
    ids=lambda p: "-".join(p),
)
def tiny(
    request: pytest.FixtureRequest, tiny_builds: dict[str, str]
) -> Iterator[ExternalAllocator]:
    mode, fault_path = request.param
    env = {FAULT_PATH_ENV: fault_path}
    tiny = open_allocator(parse_allocator_spec(tiny_builds[mode]), env=env)
    assert isinstance(tiny, ExternalAllocator)
    assert tiny.runner.mode == mode
    # The runs' page touches take the fault path asked for.
    assert tiny.run(Run(machine("pool-on-node0"), AllocCall(4096))).fault_path == fault_path
    assert tiny.runner.objects and tiny.runner.objects[-1].endswith(".so")
    yield tiny
    tiny.close()


def Run(machine: Machine, call: AllocCall, plan: FaultPlan | None = None) -> EngineRun:  # noqa: N802
    """compare's run: allocate, write the first byte, free."""
    return EngineRun(machine, Alloc(call, write=True, free=True), plan=plan)


def _plan(op: str, err: str) -> FaultPlan:
    return FaultPlan.from_rules([{"op": op, "errno": err}])


def test_hugetlb_on_the_pool_node(tiny: ExternalAllocator) -> None:
    o = tiny.run(Run(machine("pool-on-node0"), AllocCall(4 * MiB, "AnonymousHugetlb", numa_node=0)))
    assert o.outcome == "ok", o
    assert o.handle is not None
    assert (o.handle["backing"], o.handle["mapped_size"], o.handle["alignment"]) == (
        "AnonymousHugetlb", 4 * MiB, 2 * MiB,
    )  # fmt: skip
    assert o.held == {"mappings": 0, "fds": 0}
    assert o.warnings == []
    # The raw mask and maxnode as the allocator passed them (one word, maxnode 64).
    assert any(t.startswith("mbind(") and "MPOL_BIND, [0], 64, 0) = 0" in t for t in o.trace)
    assert o.trace[-1].startswith("munmap(")


def test_simulated_sigbus_kills_the_process_in_alloc(tiny: ExternalAllocator) -> None:
    o = tiny.run(Run(machine("pool-on-node0"), AllocCall(4 * MiB, "AnonymousHugetlb", numa_node=1)))
    assert o.outcome == "crashed"
    assert (o.signal, o.stage, o.simulated) == ("SIGBUS", "alloc", True)
    assert o.detail.startswith("SIGBUS in prefault touch (node 1, 2048 kB pages): no free 2048 kB")
    assert o.warnings == ["populate failed (Bad address); touching pages"]
    assert o.trace[-1].endswith("+++ killed by SIGBUS +++")
    assert "MADV_POPULATE_WRITE) = -1 EFAULT" in o.trace[-2]


def test_user_write_without_prefault_is_the_sigbus(tiny: ExternalAllocator) -> None:
    call = AllocCall(4 * MiB, "AnonymousHugetlb", numa_node=1, prefault=False)
    o = tiny.run(Run(machine("pool-on-node0"), call))
    assert o.outcome == "crashed"
    assert (o.signal, o.stage) == ("SIGBUS", "write")


def test_mmap_fault_falls_back_and_reads_simulated_meminfo(tiny: ExternalAllocator) -> None:
    run = Run(
        machine("pool-on-node0"),
        AllocCall(4 * MiB, "AnonymousHugetlb"),
        plan=FaultPlan.from_rules([{"op": "mmap", "errno": "ENOMEM", "nth": 1}]),
    )
    o = tiny.run(run)
    assert o.outcome == "demoted" and o.handle is not None  # hugepages asked, 4 KiB given
    assert o.handle["backing"] == "Anonymous"
    # std::ifstream("/proc/meminfo") read the simulated host (64 pages), not this one.
    assert len(o.warnings) == 1
    assert o.warnings[0].startswith("hugetlb failed for size=4194304 (Cannot allocate memory)")
    assert o.warnings[0].endswith("HugePages_Total:      64 HugePages_Free:       64")
    assert "(injected)" in o.trace[0]


def test_failed_munmap_is_a_leak_at_exit(tiny: ExternalAllocator) -> None:
    o = tiny.run(Run(machine("ample"), AllocCall(4 * MiB), plan=_plan("munmap", "EINVAL")))
    assert o.outcome == "ok"
    assert o.held == {"mappings": 1, "fds": 0}
    assert o.warnings == ["munmap failed: Invalid argument"]


def test_shm_memfd_stays_simulated(tiny: ExternalAllocator) -> None:
    o = tiny.run(Run(machine("ample"), AllocCall(4 * MiB, "AnonymousShmHugetlb", numa_node=1)))
    assert o.outcome == "ok" and o.handle is not None
    assert o.handle["backing"] == "AnonymousShmHugetlb"
    ops = [t.split("(")[0] for t in o.trace]
    # memfd, map, bind, populate, the user's first write (a fault), free.
    assert ops == [
        "memfd_create",
        "ftruncate",
        "mmap",
        "mbind",
        "madvise",
        "touch",
        "munmap",
        "close",
    ]
    assert o.trace[0].endswith("= 1000000")  # a simulated fd: never a real one
    assert o.held == {"mappings": 0, "fds": 0}
    f = tiny.run(
        Run(machine("ample"), AllocCall(4 * MiB, "AnonymousShm"), plan=_plan("ftruncate", "ENOSPC"))
    )
    assert (f.outcome, f.failure) == ("failed", "invalid")
    assert f.held == {"mappings": 0, "fds": 0}
    assert [t.split("(")[0] for t in f.trace] == ["memfd_create", "ftruncate", "close"]


def test_node_63_mask_loses_its_bit(tiny: ExternalAllocator) -> None:
    o = tiny.run(Run(machine("ample"), AllocCall(4096, numa_node=63)))
    assert o.outcome == "ok"
    assert o.warnings == ["mbind(node=63) failed: Invalid argument"]


def test_kernel_5_10_touches_every_page(tiny: ExternalAllocator) -> None:
    o = tiny.run(Run(machine("ample", "5.10.0"), AllocCall(64 * MiB, numa_node=1)))
    assert o.outcome == "ok"
    assert o.warnings == ["populate failed (Invalid argument); touching pages"]
    touches = [t for t in o.trace if t.startswith("touch(")]
    assert len(touches) > 5  # page faults of the manual prefault reached the simulator


def test_not_an_allocator_could_not_run(capi_probe: str) -> None:
    with pytest.raises(CouldNotRun, match=r"capi_probe\.so: ImportError: .*not a Python extension"):
        open_allocator(parse_allocator_spec(capi_probe))
    with pytest.raises(CouldNotRun, match=r"no_such_module_xyz: ModuleNotFoundError"):
        open_allocator(parse_allocator_spec("no_such_module_xyz"))


def test_memory_cgroup_oom_kill_is_a_real_sigkill(tiny: ExternalAllocator) -> None:
    m = machine("ample")
    m.memcg_max = 1 << 30
    o = tiny.run(Run(m.validate(), AllocCall(2 << 30)))
    assert o.outcome == "crashed"
    assert (o.signal, o.stage, o.simulated) == ("SIGKILL", "alloc", True)
    assert "madvise(" in o.trace[-1] and "SIGKILL" in o.trace[-1]
