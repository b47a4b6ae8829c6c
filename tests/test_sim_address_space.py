"""The simulated process's address space is the simulated host's (issue 26, point 4).

The analyst's own limits (``ulimit -v``, a small VM) never change a verdict: a run under
RLIMIT_AS 8 GiB answers exactly as an unlimited one, while the simulated host's RLIMIT_AS (a
scenario's or dump's) and its TASK_SIZE still refuse what they refuse
(docs/kernel-model.md section 6).
"""

from __future__ import annotations

import errno
import json
import re
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from umbp_sim import UMBPHostBufferBacking as B, UMBPHostMemAllocator, _native
from umbp_sim.machine import GiB, Machine, MiB
from umbp_sim.sim import SimHost

C = _native.constants
RW = C["PROT_READ"] | C["PROT_WRITE"]
PRIV_NORES = C["MAP_PRIVATE"] | C["MAP_ANONYMOUS"] | C["MAP_NORESERVE"]
TiB = 1 << 40
LIMIT = 8 * GiB  # the issue's `ulimit -v 8G`
REPLAY = Path(__file__).resolve().parent / "data" / "replay"
ADDRESS = re.compile(r"0x[0-9a-f]{6,}")


def _limit_as() -> None:  # preexec_fn: the analyst's own limit, in the child only
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


def _cli(*args: str, limited: bool) -> subprocess.CompletedProcess[str]:
    code = "import sys; from umbp_sim.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-P", "-c", code, *args],
        capture_output=True, text=True, timeout=300,
        preexec_fn=_limit_as if limited else None,
    )  # fmt: skip


def _python(code: str, limited: bool) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-P", "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=300,
        preexec_fn=_limit_as if limited else None,
    )  # fmt: skip


def _same_verdict(args: list[str]) -> tuple[str, str]:
    free = _cli(*args, limited=False)
    capped = _cli(*args, limited=True)
    assert capped.returncode == free.returncode, capped.stdout[-3000:] + capped.stderr[-3000:]
    # Real addresses differ from run to run (ASLR): everything else is the same.
    return ADDRESS.sub("ADDR", free.stdout), ADDRESS.sub("ADDR", capped.stdout)


@pytest.mark.torch  # the bundled library has sglang scenarios (`tox -e notorch`: exit 65)
def test_the_bundled_scenarios_answer_the_same_under_the_analysts_rlimit_as() -> None:
    free, capped = _same_verdict(["run", "--json"])
    doc = json.loads(capped)
    assert doc["failed"] == 0 and doc["passed"] > 60
    assert capped == free


def test_a_50gib_replay_is_ok_under_the_analysts_rlimit_as() -> None:
    free, capped = _same_verdict(
        ["replay", str(REPLAY / "report2-176.71GB"), "--size", "50GiB", "--json"]
    )
    assert json.loads(capped)["outcome"] == "ok"
    assert "address space" not in capped
    assert capped == free


PROBE = """
    import errno, json
    from umbp_sim import UMBPHostBufferBacking as B, UMBPHostMemAllocator, _native
    from umbp_sim.machine import GiB, Machine
    from umbp_sim.sim import SimHost
    out = {}
    host = SimHost(Machine.x86_64(mem_per_node="512GiB", hugepages={"2MiB": 40960}))
    a = UMBPHostMemAllocator(host.kernel)
    h = a.alloc(64 * GiB, B.AnonymousHugetlb)
    out["big"] = [bool(h), str(h.actual_backing), host.hugepages().free]
    a.free(h)
    out["after_free"] = [host.hugepages().free, host.mappings()]
    limited = SimHost(Machine.x86_64(mem_per_node="64GiB", rlimit_as=4 * GiB))
    b = UMBPHostMemAllocator(limited.kernel)
    out["sim_rlimit"] = [bool(b.alloc(6 * GiB)), [r.rule for r in limited.reasons()]]
    out["task_size"] = [
        host.kernel.mmap(0, 200 << 40, 3, _native.constants["MAP_PRIVATE"]
                         | _native.constants["MAP_ANONYMOUS"]
                         | _native.constants["MAP_NORESERVE"]).errno_name,
        [r.rule for r in host.reasons()][-1],
    ]
    print(json.dumps(out))
"""


def test_the_simulated_limits_still_refuse_under_the_analysts_rlimit_as() -> None:
    free = _python(PROBE, limited=False)
    capped = _python(PROBE, limited=True)
    assert free.returncode == 0, free.stderr
    assert capped.returncode == 0, capped.stderr
    assert json.loads(capped.stdout) == json.loads(free.stdout)
    assert json.loads(capped.stdout) == {
        "big": [True, "UMBPHostBufferBacking.AnonymousHugetlb", 40960 - 32768],
        "after_free": [40960, []],
        "sim_rlimit": [False, ["rlimit_as"]],
        "task_size": ["ENOMEM", "address_space"],
    }


def test_more_than_the_simulated_address_space_is_enomem_with_its_reason() -> None:
    host = SimHost(Machine.x86_64(mem_per_node="64GiB"))
    r = host.kernel.mmap(0, 200 * TiB, RW, PRIV_NORES)
    assert r.error == errno.ENOMEM
    why = host.reasons()[-1]
    assert why.rule == "address_space"
    assert re.fullmatch(
        r"no room for 219902325555200 bytes in the address space: the simulated process's user "
        r"address space \(TASK_SIZE\) is 140737488351232 bytes, it maps 0 and asks for "
        r"219902325555200 more",
        why.text,
    ), why.text
    assert why.numbers == {"length": 200 * TiB, "vm": 0, "task_size": (1 << 47) - 4096}
    # Below it, a NORESERVE mapping of any size is the simulated host's to give.
    assert host.kernel.mmap(0, 100 * TiB, RW, PRIV_NORES).ok


def test_arm64_has_a_48_bit_address_space() -> None:
    host = SimHost(Machine.arm64(mem_per_node="64GiB"))
    assert host.kernel.mmap(0, 200 * TiB, RW, PRIV_NORES).ok
    assert host.kernel.mmap(0, 100 * TiB, RW, PRIV_NORES).error == errno.ENOMEM


def test_a_buffer_the_analysts_address_space_cannot_hold_is_at_an_unbacked_address() -> None:
    p = _python(
        """
        import json
        from umbp_sim import UMBPHostMemAllocator
        from umbp_sim.machine import GiB, Machine
        from umbp_sim.sim import SimHost
        host = SimHost(Machine.x86_64(mem_per_node="512GiB"))
        a = UMBPHostMemAllocator(host.kernel)
        small, big = a.alloc(1 << 20), a.alloc(32 * GiB, prefault=False)
        import ctypes
        ctypes.memset(small.ptr, 7, 1 << 20)  # a buffer that fits is real memory
        k = host.kernel
        print(json.dumps([small.ptr < 1 << 56, big.ptr >= 0x0180 << 48, k.backed(small.ptr),
                          k.backed(big.ptr), big.mapped_size]))
        a.free(small)
        a.free(big)
        """,
        limited=True,
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == [True, True, True, False, 32 * GiB]


def test_unbacked_ranges_are_reused_and_never_overlap() -> None:
    p = _python(
        """
        import json
        from umbp_sim import _native
        from umbp_sim.machine import GiB, Machine
        from umbp_sim.sim import SimHost
        C = _native.constants
        RW, FLAGS = C["PROT_READ"] | C["PROT_WRITE"], C["MAP_PRIVATE"] | C["MAP_ANONYMOUS"]
        k = SimHost(Machine.x86_64(mem_per_node="512GiB")).kernel
        starts = []
        for _ in range(3):
            r = k.mmap(0, 64 * GiB, RW, FLAGS | C["MAP_NORESERVE"])
            starts.append([r.ok, r.value, k.backed(r.value), k.munmap(r.value, 64 * GiB).ok])
        a = k.mmap(0, 64 * GiB, RW, FLAGS).value
        other = SimHost(Machine.x86_64(mem_per_node="512GiB")).kernel
        b = other.mmap(0, 32 * GiB, RW, FLAGS).value
        print(json.dumps([starts, b >= a + 64 * GiB or b + 32 * GiB <= a]))
        """,
        limited=True,
    )
    assert p.returncode == 0, p.stderr
    starts, apart = json.loads(p.stdout)
    assert [s[0] for s in starts] == [True] * 3 and not any(s[2] for s in starts)
    assert all(s[3] for s in starts)
    assert len({s[1] for s in starts}) == 1  # the range given back is handed out again
    assert apart  # process-wide: another kernel's range is elsewhere


@pytest.mark.parametrize("size", [64 * MiB, 2 * GiB])
def test_a_buffer_that_fits_is_writable_memory(size: int) -> None:
    import ctypes

    host = SimHost(Machine.x86_64(mem_per_node="16GiB"))
    a = UMBPHostMemAllocator(host.kernel)
    h = a.alloc(size, B.Anonymous, prefault=False)
    assert host.kernel.backed(h.ptr)
    ctypes.memset(h.ptr + size - 4096, 1, 4096)
    a.free(h)
