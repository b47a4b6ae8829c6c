"""The scenario runner beyond the library: outcomes, counters, steps, leaks, failure reports.

Each test writes a small scenario, runs it on a simulated host and checks what the runner
observed and how it compares, including runs whose expectations are deliberately wrong.
"""

from __future__ import annotations

import logging
import shutil
import textwrap
from pathlib import Path

import pytest

from umbp_sim.engine.record import RunRecord
from umbp_sim.scenario.scenario_run import ScenarioResult, compare, run_scenario
from umbp_sim.scenario.schema import ScenarioError, load_scenario

DUMPS = Path(__file__).resolve().parent.parent / "scenarios" / "dumps"
HEAD = '[scenario]\nname = "t"\ndescription = "runner test"\n'
POOL = '[machine]\nnodes = 2\nmem_per_node = "16GiB"\nhugepages = { "2MiB" = 1024 }\n'
NO_POOL = '[machine]\nnodes = 1\nmem_per_node = "16GiB"\n'


def run(tmp_path: Path, body: str, expect: str = 'outcome = "ok"') -> ScenarioResult:
    p = tmp_path / "t.toml"
    p.write_text(HEAD + textwrap.dedent(body) + "[expect]\n" + textwrap.dedent(expect))
    # These tests check umbp-sim's allocator (its texts and fallbacks); the field's profile has
    # its own scenarios (scenarios/mori) and tests (test_profiles.py).
    return run_scenario(load_scenario(p), "umbp-sim")


def null_handle(size: int, backing: str, node: int = -1) -> str:
    return (
        f"RuntimeError: UMBPHostMemAllocator.alloc({size} bytes) failed "
        f"(requested_backing=UMBPHostBufferBacking.{backing}, numa_node={node})."
    )


# ---- outcomes ------------------------------------------------------------------------------
def test_alloc_ok_counters_are_read_before_the_free(tmp_path: Path) -> None:
    r = run(
        tmp_path,
        POOL + '[request]\nsize = "1GiB"\nbacking = "AnonymousHugetlb"\nnuma_node = 0\n',
        'outcome = "ok"\nno_leaks = true\ncounters = { "hugepages.2MiB.free" = 512, '
        '"node0.hugepages.2MiB.free" = 0, "node1.hugepages.2MiB.total" = 512, '
        '"hugepages.2MiB.reserved" = 0, "meminfo.HugePages_Free" = 512 }\n',
    )
    assert r.passed, r.report()
    o = r.observed
    assert (o.outcome, o.actual_backing, o.mapped_size) == ("ok", "AnonymousHugetlb", 1 << 30)
    assert (o.error, o.signal, o.crash_node, o.warnings, o.leaks) == (None, None, None, [], [])
    assert o.counters == {
        "hugepages.2MiB.free": 512,
        "node0.hugepages.2MiB.free": 0,
        "node1.hugepages.2MiB.total": 512,
        "hugepages.2MiB.reserved": 0,
        "meminfo.HugePages_Free": 512,
    }
    assert "MAP_HUGETLB|MAP_HUGE_2MB" in o.trace_text() and "mbind(" in o.trace_text()


def test_alloc_demoted(tmp_path: Path) -> None:
    r = run(tmp_path, NO_POOL + '[request]\nsize = "64MiB"\nbacking = "AnonymousHugetlb"\n')
    o = r.observed
    assert (o.outcome, o.actual_backing, o.mapped_size) == ("demoted", "Anonymous", 64 << 20)
    assert o.warnings == [
        "hugetlb mmap of 67108864 bytes (2048 kB pages) failed: ENOMEM; HugePages of 2048 kB: "
        "free 0, total 0, reserved 0; falling back to 4 KiB pages (Anonymous)"
    ]
    assert r.mismatches == ["outcome: expected 'ok', got 'demoted'"]


def test_anonymous_request_is_never_demoted(tmp_path: Path) -> None:
    r = run(tmp_path, NO_POOL + '[request]\nsize = "64MiB"\n', 'outcome = "ok"\nno_warnings = true')
    assert r.passed and r.observed.actual_backing == "Anonymous"


def test_alloc_failed_has_sglangs_null_handle_error(tmp_path: Path) -> None:
    body = NO_POOL + 'rlimit_as = "1GiB"\n[request]\nsize = "2GiB"\nbacking = "AnonymousShm"\n'
    r = run(tmp_path, body, 'outcome = "failed"\nno_leaks = true\n')
    assert r.passed, r.report()
    o = r.observed
    assert (o.outcome, o.actual_backing, o.mapped_size) == ("failed", None, None)
    assert o.error == null_handle(2 << 30, "AnonymousShm")
    assert o.warnings == [
        "mmap of 2147483648 bytes (AnonymousShm, 4 KiB pages) failed: ENOMEM; returning an "
        "invalid handle"
    ]


def test_alloc_crashed_is_not_checked_for_leaks(tmp_path: Path) -> None:
    body = (
        '[machine]\nnodes = 2\nmem_per_node = "16GiB"\n'
        'hugepages_per_node = [{ "2MiB" = 1024 }, { "2MiB" = 0 }]\nkernel_version = "5.4.0"\n'
        '[request]\nsize = "64MiB"\nbacking = "AnonymousHugetlb"\nnuma_node = 1\n'
    )
    r = run(tmp_path, body, 'outcome = "crashed"\nsignal = "SIGBUS"\ncrash_node = 1\n')
    assert r.passed, r.report()
    o = r.observed
    assert (o.signal, o.crash_node, o.actual_backing) == ("SIGBUS", 1, None)
    assert o.error is not None and o.error.startswith("killed by SIGBUS during prefault touch")
    assert o.leaks == []  # the mapping is still there, but a dead process is not audited
    assert "+++ killed by SIGBUS +++" in o.trace_text()


def test_memcg_oom_is_sigkill(tmp_path: Path) -> None:
    body = NO_POOL + 'memcg_max = "1GiB"\n[request]\nsize = "2GiB"\n'
    r = run(tmp_path, body, 'outcome = "crashed"\nsignal = "SIGKILL"\ncrash_node = 0\n')
    assert r.passed, r.report()


@pytest.mark.torch  # start_host_pool makes torch tensors
def test_sglang_outcomes(tmp_path: Path) -> None:
    model = (
        '[request]\nkind = "sglang"\nlayers = 2\nkv_heads = 2\nhead_dim = 64\n'
        "hicache_size = 0.1\npage_size = 64\n"
    )
    ok = run(tmp_path, POOL + model, 'outcome = "ok"\nno_leaks = true\nno_warnings = true\n')
    assert ok.passed, ok.report()
    assert ok.observed.actual_backing == "AnonymousHugetlb"
    demoted = run(tmp_path, NO_POOL + model, 'outcome = "demoted"\nno_leaks = true\n')
    assert demoted.passed, demoted.report()
    assert demoted.observed.warnings[-1].startswith(
        "UMBPHostTensorAllocator: requested UMBPHostBufferBacking.AnonymousHugetlb backing "
        "but kernel demoted"
    )
    env = '[env]\nSGLANG_HICACHE_HOST_NUMA_NODE = "one"\n'
    failed = run(tmp_path, NO_POOL + env + model, 'outcome = "failed"\n')
    assert failed.observed.error == "ValueError: invalid literal for int() with base 10: 'one'"
    assert failed.passed


# ---- compare: every expectation key produces its own mismatch line ---------------------------
def test_compare_lists_every_difference() -> None:
    obs = RunRecord(
        outcome="demoted",
        actual_backing="Anonymous",
        mapped_size=4096,
        error="boom",
        signal=None,
        crash_node=None,
        warnings=["hugetlb mmap failed: ENOMEM"],
        counters={"hugepages.2MiB.free": 3},
        steps=["freed"],
        leaks=["fd 7 still open"],
    )
    expect = {
        "outcome": "ok",
        "actual_backing": "AnonymousHugetlb",
        "mapped_size": "2MiB",
        "error": "bang",
        "error_regex": "^ba",
        "signal": "SIGBUS",
        "crash_node": 1,
        "warnings": ["ENOMEM", "EFAULT"],
        "no_warnings": True,
        "counters": {"hugepages.2MiB.free": 4},
        "steps": ["freed", "freed"],
        "no_leaks": True,
    }
    assert compare(expect, obs) == [
        "outcome: expected 'ok', got 'demoted'",
        "actual_backing: expected 'AnonymousHugetlb', got 'Anonymous'",
        "mapped_size: expected 2097152, got 4096",
        "error: expected 'bang', got 'boom'",
        "error: 'boom' does not match /^ba/",
        "signal: expected 'SIGBUS', got None",
        "crash_node: expected 1, got None",
        "warnings: none contains 'EFAULT'",
        "warnings: expected none, got ['hugetlb mmap failed: ENOMEM']",
        "counters.hugepages.2MiB.free: expected 4, got 3",
        "steps: expected ['freed', 'freed'], got ['freed']",
        "leaks: fd 7 still open",
    ]
    same = {"outcome": "demoted", "error_regex": "^bo", "warnings": ["mmap failed"]}
    assert compare(same, obs) == []


def test_failure_report_has_mismatches_warnings_and_the_syscall_trace(tmp_path: Path) -> None:
    body = NO_POOL + '[request]\nsize = "64MiB"\nbacking = "AnonymousHugetlb"\n'
    r = run(tmp_path, body, 'outcome = "ok"\nactual_backing = "AnonymousHugetlb"\n')
    assert not r.passed
    lines = r.report().splitlines()
    assert lines[0] == f"{tmp_path / 't.toml'}: t"
    assert lines[1:3] == [
        "  outcome: expected 'ok', got 'demoted'",
        "  actual_backing: expected 'AnonymousHugetlb', got 'Anonymous'",
    ]
    assert lines[3] == "  warnings:"
    assert lines[4].startswith("    hugetlb mmap of 67108864 bytes (2048 kB pages) failed: ENOMEM")
    assert lines[5] == "  syscall trace:"
    trace = lines[6:]
    assert trace[0] == (
        "    mmap(NULL, 67108864, PROT_READ|PROT_WRITE, "
        "MAP_PRIVATE|MAP_ANONYMOUS|MAP_HUGETLB|MAP_HUGE_2MB, -1, 0) = -1 ENOMEM (Cannot "
        "allocate memory)"
    )
    assert any(t.startswith("    madvise(0x") and "MADV_POPULATE_WRITE) = 0" in t for t in trace)
    assert trace[-1].startswith("    munmap(0x")  # the runner's own free, after the request


def test_fault_rules_are_applied_and_traced(tmp_path: Path) -> None:
    body = (
        POOL + '[[faults]]\nop = "madvise"\nadvice = "MADV_POPULATE_WRITE"\nerrno = "EIO"\n'
        '[request]\nsize = "64MiB"\nbacking = "AnonymousHugetlb"\n'
    )
    r = run(tmp_path, body, 'outcome = "failed"\nno_leaks = true\n')
    assert r.passed, r.report()
    assert r.observed.warnings == [
        "MADV_POPULATE_WRITE of 67108864 bytes (AnonymousHugetlb, 2048 kB pages) failed: EIO; "
        "unmapped, returning an invalid handle"
    ]
    assert "MADV_POPULATE_WRITE) = -1 EIO" in r.observed.trace_text()


# ---- steps -----------------------------------------------------------------------------------
STEPS = '[request]\nkind = "steps"\nsteps = [\n{}\n]\n'


def steps(*rows: str) -> str:
    return STEPS.replace("{}", ",\n".join(rows))


def test_steps_record_each_operation(tmp_path: Path) -> None:
    body = NO_POOL + steps(
        '{ op = "set_nr_hugepages", pages = 64 }',
        '{ op = "alloc", id = "a", size = "64MiB", backing = "AnonymousShmHugetlb" }',
        '{ op = "alloc", id = "b", size = "256MiB", backing = "AnonymousHugetlb" }',
        '{ op = "alloc", id = "c", size = 0 }',
        '{ op = "lookup", id = "a", offset = 4096, size = 4096 }',
        '{ op = "acquire", id = "a", offset = "70MiB" }',
        '{ op = "release", id = "a" }',
        '{ op = "free", id = "a" }',
        '{ op = "free", id = "b" }',
        '{ op = "free", id = "c" }',
        '{ op = "set_nr_hugepages", pages = 0 }',
    )
    r = run(
        tmp_path,
        body,
        'outcome = "failed"\nno_leaks = true\n'
        'counters = { "hugepages.2MiB.total" = 0, "hugepages.2MiB.free" = 0 }\n',
    )
    assert r.passed, r.report()
    assert r.observed.steps == [
        "nr_hugepages 64",
        "alloc ok AnonymousShmHugetlb 67108864",
        "alloc demoted Anonymous 268435456",
        "alloc failed",
        "lookup found 67108864",
        "acquire none",  # 70 MiB is past the 64 MiB buffer
        "released",
        "freed",
        "freed",
        "freed",
        "nr_hugepages 0",
    ]
    # the failed alloc decides the outcome and the error; the last good alloc the backing
    assert r.observed.error == null_handle(0, "Anonymous")
    assert r.observed.actual_backing == "Anonymous"
    assert any("without a matching AcquireShmAllocation" in w for w in r.observed.warnings)


def test_steps_demoted_outcome(tmp_path: Path) -> None:
    body = NO_POOL + steps(
        '{ op = "alloc", id = "a", size = "2MiB", backing = "AnonymousHugetlb" }',
        '{ op = "alloc", id = "b", size = "2MiB" }',
        '{ op = "free", id = "a" }',
        '{ op = "free", id = "b" }',
    )
    r = run(tmp_path, body, 'outcome = "demoted"\nno_leaks = true\n')
    assert r.passed, r.report()


def test_steps_unknown_id_is_a_scenario_error(tmp_path: Path) -> None:
    body = NO_POOL + steps('{ op = "free", id = "ghost" }')
    with pytest.raises(ScenarioError, match=r"t\.toml: \[request\]\.steps\[0\]\.id: 'ghost' "):
        run(tmp_path, body)


def test_deferred_free_happens_at_release(tmp_path: Path) -> None:
    rows = [
        '{ op = "alloc", id = "a", size = "8MiB", backing = "AnonymousShmHugetlb" }',
        '{ op = "acquire", id = "a" }',
        '{ op = "acquire", id = "a", offset = "2MiB" }',
        '{ op = "free", id = "a" }',
        '{ op = "lookup", id = "a" }',
        '{ op = "acquire", id = "a" }',
        '{ op = "release", id = "a" }',
    ]
    held = run(tmp_path, POOL + steps(*rows), 'outcome = "ok"\nno_leaks = true\n')
    assert held.observed.steps[1:] == [
        "acquire found 8388608",
        "acquire found 8388608",
        "freed",
        "lookup none",  # a buffer whose free is pending is not handed out again
        "acquire none",
        "released",
    ]
    assert any("while 2 registration(s) hold it" in w for w in held.observed.warnings)
    # one registration is still held: the buffer, its fd and its pages are leaked
    assert not held.passed
    assert any("(free deferred) still held" in leak for leak in held.observed.leaks)
    assert any(leak.startswith("simulated fd ") for leak in held.observed.leaks)
    released = run(
        tmp_path,
        POOL + steps(*rows, '{ op = "release", id = "a" }'),
        'outcome = "ok"\nno_leaks = true\ncounters = { "hugepages.2MiB.free" = 1024 }\n',
    )
    assert released.passed, released.report()
    assert "munmap(0x" in released.observed.trace[-2]
    assert released.observed.trace[-1].startswith("close(")


# ---- leak detection ---------------------------------------------------------------------------
def test_leak_of_a_buffer_never_freed(tmp_path: Path) -> None:
    body = POOL + steps('{ op = "alloc", id = "a", size = "4MiB", backing = "AnonymousHugetlb" }')
    r = run(tmp_path, body, 'outcome = "ok"\nno_leaks = true\n')
    assert not r.passed
    leaks = r.observed.leaks
    assert any(x.startswith("simulated mapping 0x") and "length 4194304" in x for x in leaks)
    assert any(x.endswith("(4194304 bytes, AnonymousHugetlb) not freed") for x in leaks)
    assert any(x.endswith("length 4194304 (4MiB) still mapped") for x in leaks)
    assert r.mismatches == [f"leaks: {'; '.join(leaks)}"]


def test_leak_after_a_failed_munmap(tmp_path: Path) -> None:
    body = (
        POOL + '[[faults]]\nop = "munmap"\nerrno = "EINVAL"\n'
        '[request]\nsize = "4MiB"\nbacking = "AnonymousHugetlb"\n'
    )
    r = run(tmp_path, body, 'outcome = "ok"\nno_leaks = true\n')
    assert not r.passed
    assert any("handle invalidated anyway" in w for w in r.observed.warnings)
    # the allocator forgot the buffer, but the mapping is still there
    assert not any("not freed" in x for x in r.observed.leaks)
    assert any(x.startswith("simulated mapping ") for x in r.observed.leaks)


def test_reservations_of_other_processes_are_not_leaks(tmp_path: Path) -> None:
    body = (
        POOL.replace("1024", "8") + 'hugepages_reserved = { "2MiB" = 6 }\n'
        '[request]\nsize = "4MiB"\nbacking = "AnonymousHugetlb"\nprefault = false\n'
    )
    r = run(
        tmp_path,
        body,
        'outcome = "ok"\nno_leaks = true\ncounters = { "hugepages.2MiB.reserved" = 8 }\n',
    )
    assert r.passed, r.report()


# ---- machines and counters at run time ---------------------------------------------------------
def test_dump_with_overrides(tmp_path: Path) -> None:
    shutil.copy(DUMPS / "32intel64-2p8co2t+8ve.tar.bz2", tmp_path)  # inside the scenario's tree
    body = (
        '[machine]\ndump = "32intel64-2p8co2t+8ve.tar.bz2"\n'
        'kernel_version = "6.1.0"\nhugepages_reserved = { "2MiB" = 4000 }\n'
        '[request]\nsize = "1GiB"\nbacking = "AnonymousHugetlb"\n'
    )
    r = run(
        tmp_path,
        body,
        'outcome = "demoted"\nno_leaks = true\ncounters = { "hugepages.2MiB.total" = 4096 }\n',
    )
    assert r.passed, r.report()
    assert "free 4096, total 4096, reserved 4000" in r.observed.warnings[0]
    # 6.1 has MADV_POPULATE_WRITE: no touch-prefault warning as on the dump's own 3.10
    assert len(r.observed.warnings) == 1


@pytest.mark.parametrize(
    ("machine", "error"),
    [
        (
            '[machine]\ndump = "2i386-2c-nohugepage.tar.bz2"\nnodes = 2\n',
            "[machine].nodes: cannot be combined with dump",
        ),
        (
            NO_POOL + 'free_hugepages_per_node = [{ "2MiB" = 0 }, { "2MiB" = 0 }]\n',
            "[machine].free_hugepages_per_node: needs one table per node (1)",
        ),
        (
            NO_POOL + 'hugepages = { "2MiB" = 4 }\nhugepages_reserved = { "2MiB" = 5 }\n',
            "[machine]: hugepages_reserved[2097152]: 5 reserved but only 4 free",
        ),
        (NO_POOL + 'kernel_version = "linux"\n', "[machine]: kernel_version: cannot read"),
        (NO_POOL.replace('"16GiB"', '"lots"'), "[machine].mem_per_node: cannot read size 'lots'"),
    ],
)
def test_bad_machine_is_a_scenario_error(tmp_path: Path, machine: str, error: str) -> None:
    shutil.copy(DUMPS / "2i386-2c-nohugepage.tar.bz2", tmp_path)  # inside the scenario's tree
    with pytest.raises(ScenarioError) as ei:
        run(tmp_path, machine + "[request]\nsize = 1\n")
    msg = str(ei.value)
    assert msg.startswith(f"{tmp_path / 't.toml'}: ") and error in msg and "\n" not in msg


@pytest.mark.parametrize(
    ("counter", "error"),
    [
        ("hugepages.2MiB.used", "no such counter"),
        ("node0.hugepages.2MiB.reserved", "no such counter"),  # no per-node Rsvd
        ("meminfo.NoSuchLine", "no such counter"),
        ("hugepages.16MiB.free", "hugepage size 16777216: not a size of this host"),
        ("node7.hugepages.2MiB.free", "node 7: not a node of this host"),
    ],
)
def test_bad_counter_is_a_scenario_error(tmp_path: Path, counter: str, error: str) -> None:
    with pytest.raises(ScenarioError) as ei:
        run(
            tmp_path,
            POOL + "[request]\nsize = 1\n",
            f'outcome = "ok"\ncounters = {{ "{counter}" = 0 }}\n',
        )
    assert str(ei.value).startswith(f"{tmp_path / 't.toml'}: [expect].counters.{counter}: ")
    assert error in str(ei.value)


def test_sglang_sizing_error_is_a_scenario_error(tmp_path: Path) -> None:
    body = (
        '[request]\nkind = "sglang"\nlayers = 2\nkv_heads = 2\nhead_dim = 64\n'
        'hicache_size = 1\nlayout = "page_first_kv_split"\n'
    )
    with pytest.raises(ScenarioError, match=r"t\.toml: \[request\]: layout: Unsupported layout"):
        run(tmp_path, NO_POOL + body)


@pytest.mark.parametrize(
    ("tp_size", "error"),
    [
        ("0", "must be in 1..2,147,483,647, got 0"),
        ("-2", "must be in 1..2,147,483,647, got -2"),
        ('"4"', "expected an integer, got a string ('4')"),
    ],
)
def test_bad_tp_size_is_a_scenario_error(tmp_path: Path, tp_size: str, error: str) -> None:
    """tp_size splits kv_heads as sglang does: 0 was a ZeroDivisionError ("internal error");
    the file is refused when read (its types, umbp_sim.scenario.schema)."""
    body = (
        '[request]\nkind = "sglang"\nlayers = 2\nkv_heads = 2\nhead_dim = 64\n'
        f"hicache_size = 1\ntp_size = {tp_size}\n"
    )
    with pytest.raises(ScenarioError) as ei:
        run(tmp_path, NO_POOL + body)
    assert str(ei.value) == f"{tmp_path / 't.toml'}: [request].tp_size: {error}"


# ---- isolation ---------------------------------------------------------------------------------
def test_runs_are_repeatable_and_do_not_leak_log_handlers(tmp_path: Path) -> None:
    body = NO_POOL + '[request]\nsize = "64MiB"\nbacking = "AnonymousHugetlb"\n'
    handlers = {n: list(logging.getLogger(n).handlers) for n in ("umbp_sim", "sglang")}
    first = run(tmp_path, body, 'outcome = "demoted"\n').observed.to_json()
    second = run(tmp_path, body, 'outcome = "demoted"\n').observed.to_json()
    assert first == second
    assert {n: list(logging.getLogger(n).handlers) for n in handlers} == handlers
    # each run starts from a fresh kernel: the once-per-kernel warning comes back every time
    assert first["warnings"] and second["warnings"]
