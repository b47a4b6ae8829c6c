"""Replay and preflight model the field by default: mori's allocator as deployed (its outcome,
its log as it would print), sglang as released, the RuntimeError line as input."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from umbp_sim.cli import main

D = Path(__file__).parent / "data" / "replay"
PER_NODE = [D / "pool-on-node0-6.8.0", "--size", "1GiB", "--numa-node", "1"]
LLAMA = ["--model-layers", "32", "--kv-heads", "8", "--head-dim", "128", "--page-size", "64"]
MORI_LINE = (
    "HostMemAllocator: madvise(MADV_POPULATE_WRITE) failed (14: Bad address); falling back to "
    "manual page touching"
)


def replay(capsys, *argv, code: int = 0) -> dict:  # type: ignore[no-untyped-def]
    assert main(["replay", *map(str, argv), "--json"]) == code
    return json.loads(capsys.readouterr().out)


def test_per_node_case_crashes_by_default_and_demotes_with_umbp_sims_fixes(capsys):
    doc = replay(capsys, *PER_NODE)
    assert doc["allocator"] == "mori-624002c"
    assert (doc["outcome"], doc["signal"]) == ("crashed", "SIGBUS")
    assert doc["error"].startswith("killed by SIGBUS during prefault touch of node 1")
    assert doc["log"] == []  # mori's logger runs at ERROR: the warning is not printed
    assert doc["warnings"] == [MORI_LINE]
    assert doc["with_umbp_sim_fixes"]["outcome"] == "demoted"
    # every fix shown was re-run on mori's profile and succeeds there
    assert doc["fixes"] and all(f["outcome_after"].startswith("ok: AnonymousHugetlb")
                                for f in doc["fixes"])  # fmt: skip

    # one shortage, one sentence: POPULATE_WRITE's EFAULT and then the manual touch's SIGBUS
    shortage = [c for c in doc["causes"] if "the reservation is global" in c]
    assert shortage == [
        "the reservation is global (1024 pages available on the host), so mmap succeeds; the "
        "pages are taken from node 1 at fault time and it has 0 of the 512 needed (2048 kB "
        "pages; nr_overcommit_hugepages 0, surplus 0): madvise(MADV_POPULATE_WRITE) returns "
        "EFAULT, then prefault touch faults on a missing page and the process is killed by SIGBUS"
    ]

    fixed = replay(capsys, *PER_NODE, "--allocator", "umbp-sim")
    assert (fixed["allocator"], fixed["outcome"]) == ("umbp-sim", "demoted")
    assert fixed["with_umbp_sim_fixes"] is None


def test_text_report_names_the_allocator_and_shows_moris_log(capsys):
    assert main(["replay", *map(str, PER_NODE)]) == 0
    out = capsys.readouterr().out
    assert "allocator: mori-624002c (mori's HostMemAllocator as deployed" in out
    assert "mori's log (level error, the default): nothing; with MORI_UMBP_LOG_LEVEL=warn it " \
        "would print 1 line(s):" in out  # fmt: skip
    assert "4. with umbp-sim's allocator fixes (--allocator umbp-sim)\n   simulated: demoted" in out
    assert main(["replay", *map(str, PER_NODE), "--env", "MORI_UMBP_LOG_LEVEL=warn"]) == 0
    out = capsys.readouterr().out
    assert f"   mori's log: [<time>] [<pid>] [umbp] [warning] {MORI_LINE}" in out


def test_no_fixes_section_when_the_outcome_is_the_same(capsys):
    doc = replay(capsys, D / "pool-on-node0-6.8.0", "--size", "1GiB", "--numa-node", "0")
    assert doc["outcome"] == "ok" and doc["with_umbp_sim_fixes"] is None


def test_wrong_node_is_unbound_under_mori_too(capsys):
    doc = replay(capsys, D / "pool-on-node0-6.8.0", "--size", "1GiB", "--numa-node", "3")
    assert doc["outcome"] == "ok" and doc["got_what_was_asked"] is False
    assert doc["warnings"] == ["HostMemAllocator: mbind(node=3) failed (22: Invalid argument)"]


def test_error_line_fills_the_request_and_is_reproduced(capsys):
    line = (
        "RuntimeError: UMBPHostMemAllocator.alloc(18446744073709551615 bytes) failed "
        "(requested_backing=UMBPHostBufferBacking.AnonymousHugetlb, numa_node=-1)."
    )
    doc = replay(capsys, D / "no-pool-512g", "--error", line)
    assert doc["request"].startswith("alloc(18446744073709551615 bytes, backing AnonymousHugetlb")
    assert doc["outcome"] == "failed" and doc["error"] == line
    assert doc["reproduces_error_line"] is True
    assert main(["replay", str(D / "no-pool-512g"), "--error", line]) == 0
    assert "the error line given: reproduced exactly" in capsys.readouterr().out


def test_error_line_not_reproduced_is_said(capsys):
    line = (
        "RuntimeError: UMBPHostMemAllocator.alloc(1073741824 bytes) failed "
        "(requested_backing=UMBPHostBufferBacking.AnonymousHugetlb, numa_node=1)."
    )
    doc = replay(capsys, D / "pool-on-node0-6.8.0", "--error", line)
    assert doc["outcome"] == "crashed" and doc["reproduces_error_line"] is False
    assert main(["replay", str(D / "pool-on-node0-6.8.0"), "--error", line]) == 0
    out = capsys.readouterr().out
    assert "the error line given: NOT reproduced" in out and f"given: {line}" in out


def test_flags_that_contradict_the_error_line_are_refused(capsys):
    line = (
        "RuntimeError: UMBPHostMemAllocator.alloc(1073741824 bytes) failed "
        "(requested_backing=UMBPHostBufferBacking.AnonymousHugetlb, numa_node=1)."
    )
    dump = str(D / "pool-on-node0-6.8.0")
    cases = [
        (["--size", "4GiB"], "--size 4GiB: the --error line says size 1073741824"),
        (["--numa-node", "0"], "--numa-node 0: the --error line says numa node 1"),
        (["--backing", "anonymous"], "--backing Anonymous: the --error line says backing "
                                     "AnonymousHugetlb"),
    ]  # fmt: skip
    for flags, said in cases:
        assert main(["replay", dump, "--error", line, *flags]) == 64
        err = capsys.readouterr().err
        assert err == (
            f"umbp-sim replay: {said}; leave {flags[0]} out (the line gives it) or drop --error\n"
        )
    # the same values as the line are no contradiction
    doc = replay(capsys, dump, "--error", line, "--size", "1GiB", "--numa-node", "1")
    assert doc["reproduces_error_line"] is False and doc["outcome"] == "crashed"


def test_traceback_on_stdin(capsys, monkeypatch):
    tb = (
        "Traceback (most recent call last):\n"
        '  File "sglang/srt/mem_cache/storage/umbp/umbp_host_allocator.py", line 86, in allocate\n'
        "    raise RuntimeError(\n"
        "RuntimeError: UMBPHostMemAllocator.alloc(1073741824 bytes) failed "
        "(requested_backing=UMBPHostBufferBacking.Anonymous, numa_node=-1).\n"
    )
    monkeypatch.setattr("sys.stdin", io.StringIO(tb))
    doc = replay(capsys, D / "pool-on-node0-6.8.0", "--error", "-")
    assert doc["request"].startswith("alloc(1073741824 bytes, backing Anonymous,")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--error", "nothing here"], "--error: no 'UMBPHostMemAllocator.alloc(N bytes) failed"),
        (["--error", "UMBPHostMemAllocator.alloc(1 bytes) failed (requested_backing="
                     "UMBPHostBufferBacking.Huge, numa_node=0)"], "requested_backing=Huge is not"),
        (["--size", "1", "--allocator", "glibc"], "unknown allocator profile 'glibc'"),
        (["--size", "1", "--sglang", "0.1.0"], "unknown sglang '0.1.0'"),
    ],
)  # fmt: skip
def test_bad_field_flags(capsys, argv, message):
    try:
        code = main(["replay", str(D / "pool-on-node0-6.8.0"), *argv])
    except SystemExit as e:  # argparse's own errors exit
        code = e.code
    assert code == 64
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_backing_as_written_in_the_error(capsys):
    doc = replay(capsys, D / "no-pool-512g", "--size", "1GiB",
                 "--backing", "UMBPHostBufferBacking.AnonymousShmHugetlb")  # fmt: skip
    assert "backing AnonymousShmHugetlb" in doc["request"]
    assert doc["actual_backing"] == "AnonymousShm"


@pytest.mark.torch
def test_sglang_standalone_address_asks_for_shared_buffers(capsys):
    doc = replay(capsys, D / "no-pool-512g", *LLAMA, "--hicache-size", "2", "--sglang", "0.5.23",
                 "--env", "UMBP_STANDALONE_ADDRESS=10.0.0.1:5000")  # fmt: skip
    assert doc["sglang"] == "0.5.23"
    assert "backing AnonymousShmHugetlb" in doc["request"]
    assert (doc["outcome"], doc["actual_backing"]) == ("demoted", "AnonymousShm")
    assert doc["warnings"][-1] == (
        "UMBPHostTensorAllocator: requested UMBPHostBufferBacking.AnonymousShmHugetlb backing but "
        "kernel demoted to UMBPHostBufferBacking.AnonymousShm (4 KiB pages). Check "
        "vm.nr_hugepages and HugePages_Free in /proc/meminfo. Performance and AINIC MR-size "
        "benefits will not apply."
    )


def test_preflight_defaults_to_the_field(capsys):
    code = main(["preflight", "--root", str(D / "pool-on-node0-6.8.0"), "--size", "1GiB",
                 "--numa-node", "1", "--json"])  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert (code, doc["allocator"], doc["outcome"]) == (2, "mori-624002c", "crashed")
    code = main(["preflight", "--root", str(D / "pool-on-node0-6.8.0"), "--size", "1GiB",
                 "--numa-node", "1", "--allocator", "umbp-sim", "--json"])  # fmt: skip
    assert code == 1 and json.loads(capsys.readouterr().out)["outcome"] == "demoted"


def test_run_takes_the_allocator(capsys):
    assert main(["run", "-k", "per-node-exhaustion-sigbus", "--allocator", "umbp-sim"]) == 0
    assert "1 passed, 0 failed" in capsys.readouterr().out


def test_the_error_line_is_reproduced_by_the_call_it_names_not_by_its_text() -> None:
    """A replay decides on fields: the alloc the line names (size, backing, node) returned a
    null handle. An error whose text is the line but that no null handle gave (an allocator
    that raised it) does not reproduce it; nor does another node's null handle."""
    from umbp_sim.diagnose.error_line import parse_error_line
    from umbp_sim.engine.record import RunRecord
    from umbp_sim.request import AllocRequest

    line = parse_error_line(
        "RuntimeError: UMBPHostMemAllocator.alloc(4194304 bytes) failed "
        "(requested_backing=UMBPHostBufferBacking.AnonymousHugetlb, numa_node=1)."
    )
    call = AllocRequest(4 << 20, "AnonymousHugetlb", 2 << 20, 1, True)
    null = RunRecord("failed", failure="invalid", error="(any text)", null_alloc=call)
    assert line.matches(null)
    assert not line.matches(RunRecord("failed", failure="raised", error=line.text))
    other = AllocRequest(4 << 20, "AnonymousHugetlb", 2 << 20, 0, True)
    assert not line.matches(RunRecord("failed", failure="invalid", null_alloc=other))


def test_a_null_handle_run_records_the_call_it_failed() -> None:
    from umbp_sim import Machine
    from umbp_sim.engine.execute import execute
    from umbp_sim.engine.spec import Alloc, Run
    from umbp_sim.engine.subject import BuiltinSubject
    from umbp_sim.request import AllocRequest

    call = AllocRequest(1 << 62, "AnonymousHugetlb", 2 << 20, 0, True)
    m = Machine.x86_64(nodes=2, mem_per_node="8GiB")
    rec = execute(Run(m, Alloc(call), allocator="mori-624002c"), BuiltinSubject("mori-624002c"))
    assert (rec.outcome, rec.failure, rec.null_alloc) == ("failed", "invalid", call)
    ok = execute(Run(m, Alloc(AllocRequest(4096, "Anonymous"))), BuiltinSubject("umbp-sim"))
    assert (ok.outcome, ok.null_alloc) == ("ok", None)
