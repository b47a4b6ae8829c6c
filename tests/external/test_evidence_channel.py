"""A simulated death's evidence reaches umbp-sim as data on a pipe of its own, never through the
allocator's stdout or stderr (umbp_sim/external/evidence.py, csrc/interposer/death.cpp)."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator

import pytest
from conftest import MORI_SURFACE

from umbp_sim.allocator_spec import parse_allocator_spec
from umbp_sim.comparison.matrix import machine
from umbp_sim.engine.spec import Alloc, Run
from umbp_sim.external.evidence import EvidenceReader
from umbp_sim.external.observe import record_from_reply
from umbp_sim.external.outcome import log_lines, warning_lines
from umbp_sim.external.runner import ExternalRunner
from umbp_sim.request import AllocRequest

# What the interposer used to print on stderr for a simulated SIGBUS, forged by the allocator:
# the crash line, a reasons block and a trace block.
FORGED = (
    "umbp-sim: simulated SIGBUS (page touch): SIGBUS in prefault touch (node 1, 2048 kB pages): "
    "forged\n"
    "umbp-sim: reasons:\n"
    '{"call": "touch", "rule": "forged", "errno": null, "signal": "SIGBUS", "numbers": {}, '
    '"text": "forged"}\n'
    "umbp-sim: end of reasons\n"
    "umbp-sim: syscall trace:\n"
    "touch(0x1, 4096) = +++ killed by SIGBUS +++\n"
    "umbp-sim: end of trace\n"
)

# A module with mori's surface whose alloc prints FORGED on stdout and stderr when LIAR is set
# (size 8192 then also dies of a real SIGBUS), else allocates quietly.
ALLOCATOR = """
import ctypes, enum, mmap, os, signal, sys

LIAR = {liar}
FORGED = {forged!r}


{surface}

class UMBPHostMemAllocator:
    def alloc(self, size, backing, hugepage_size=0, numa_node=-1, prefault=True):
        if LIAR:
            for stream in (sys.stdout, sys.stderr):
                stream.write(FORGED)
                stream.flush()
            if size == 8192:
                os.kill(os.getpid(), signal.SIGBUS)
        return Handle(mmap.mmap(-1, max(4096, size)), size)

    def free(self, h):
        pass
""".replace("{surface}", MORI_SURFACE)


@pytest.fixture(scope="module")
def runners(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ExternalRunner]]:
    """{"quiet": ..., "liar": ...}: the same allocator, silent and printing FORGED."""
    d = tmp_path_factory.mktemp("forgers")
    out = {}
    for name, liar in (("quiet", False), ("liar", True)):
        (d / f"{name}_alloc.py").write_text(ALLOCATOR.format(liar=liar, forged=FORGED))
        spec = parse_allocator_spec(f"{name}_alloc")
        out[name] = ExternalRunner(spec, env={"PYTHONPATH": str(d)})
    try:
        yield out
    finally:
        for r in out.values():
            r.close()


def _run(size: int) -> Run:
    return Run(machine("pool-on-node0"), Alloc(AllocRequest(size, "Anonymous")))


def test_forged_report_lines_do_not_change_an_ok_outcome(
    runners: dict[str, ExternalRunner],
) -> None:
    quiet, liar = (record_from_reply(runners[n].observe(_run(4096))) for n in ("quiet", "liar"))
    assert liar.outcome == "ok" and liar.signal is None
    assert (liar.outcome, liar.signal, liar.warnings, liar.error) == (
        quiet.outcome, quiet.signal, quiet.warnings, quiet.error,
    )  # fmt: skip


def test_forged_report_lines_do_not_make_a_real_signal_simulated(
    runners: dict[str, ExternalRunner],
) -> None:
    """The allocator prints a forged crash report, then dies of a real SIGBUS of its own: the
    outcome is that real signal, with no SimKernel detail, reasons or trace."""
    reply = runners["liar"].observe(_run(8192))
    assert reply["evidence"] is None
    assert FORGED in reply["log"]  # the allocator's log, kept as it wrote it
    rec = record_from_reply(reply)
    assert (rec.outcome, rec.signal, rec.stage, rec.simulated) == (
        "crashed", "SIGBUS", "alloc", False,
    )  # fmt: skip
    assert rec.error == "killed by SIGBUS during alloc" and rec.detail == ""
    assert (rec.reasons, rec.trace, rec.crash_node, rec.warnings) == ([], [], None, [])


def _frame(doc: object) -> bytes:
    payload = json.dumps(doc).encode()
    return struct.pack(">I", len(payload)) + payload


DEATH = {
    "event": "death", "signal": 7, "stage": "page touch",
    "kernel": {
        "crash": {
            "signal": "SIGBUS", "where": "prefault touch", "node": 1, "hugepage_size": 2 << 20,
            "detail": "no page",
            "text": "SIGBUS in prefault touch (node 1, 2048 kB pages): no page",
        },
        "reasons": [{
            "call": "touch", "rule": "r", "errno": None, "signal": "SIGBUS", "numbers": {"n": 1},
            "text": "t",
        }],
        "trace": ["mmap(...) = 0x7f0000000000", "touch(...) = +++ killed by SIGBUS +++"],
    },
}  # fmt: skip


def test_an_evidence_frame_read_byte_by_byte_is_data() -> None:
    reader = EvidenceReader()
    for b in _frame(DEATH):
        reader.feed(bytes([b]))
    d = reader.death
    assert d is not None and d.crash is not None
    assert (d.signal, d.stage, d.detail) == (
        "SIGBUS", "page touch", "SIGBUS in prefault touch (node 1, 2048 kB pages): no page",
    )  # fmt: skip
    assert (d.crash.where, d.crash.node, d.crash.hugepage_size) == ("prefault touch", 1, 2 << 20)
    (r,) = d.reasons
    assert (r.signal, r.numbers, r.text) == ("SIGBUS", {"n": 1}, "t")
    assert d.trace[-1].endswith("+++ killed by SIGBUS +++")


def test_an_injected_signal_has_no_crash_record() -> None:
    reader = EvidenceReader()
    reader.feed(_frame({**DEATH, "kernel": {"crash": None, "reasons": [], "trace": []}}))
    assert reader.death is not None and reader.death.detail == "injected"


def test_what_is_not_an_evidence_frame_ends_the_reading() -> None:
    reader = EvidenceReader()
    reader.feed(_frame(DEATH))
    first = reader.death
    reader.feed(_frame({"event": "something else"}) + _frame(DEATH))
    assert reader.death == first  # the bad frame ended the reading: the next one is not read
    reader = EvidenceReader()
    reader.feed(b"\x00\x00\x00\x03abc" + _frame(DEATH))  # not JSON
    assert reader.death is None


def test_the_log_is_the_allocators_alone() -> None:
    """Nothing in an allocator's log is umbp-sim's: a line that says warning is a warning,
    whatever it starts with."""
    log = "tiny [warning] populate failed\numbp-sim: warning forged by the allocator\n" + FORGED
    assert warning_lines(log) == ["populate failed", "umbp-sim: warning forged by the allocator"]


def test_each_line_keeps_its_level_and_lines_below_warning_are_not_kept() -> None:
    """compare's "log level": spdlog's [level] field decides, whatever the text says; a line
    without one is a warning when it says so."""
    log = (
        "[2026-12-07 10:00:00.000] [123] [umbp] [warning] hugetlb failed\n"
        "[2026-12-07 10:00:00.001] [123] [umbp] [error] mbind failed\n"
        "tiny [critical] out of memory\n"
        "[2026-12-07 10:00:00.002] [123] [umbp] [info] no warning here, an info line\n"
        "tiny [debug] warn about nothing\n"
        "plain warning: no level field\n"
        "plain text\n"
    )
    assert log_lines(log) == [
        ("warning", "hugetlb failed"),
        ("error", "mbind failed"),
        ("critical", "out of memory"),
        ("warning", "plain warning: no level field"),
    ]
    assert warning_lines(log) == [text for _, text in log_lines(log)]
