"""The evidence pipe a program under ``umbp-sim exec`` inherits cannot end umbp-sim (issue 43,
point 4; umbp_sim/external/evidence.py): a frame that is not the interposer's is one line of the
report, the program's exit status is kept, and the records of the processes it starts are
summarized as they arrive."""

from __future__ import annotations

import json
import sys
import tracemalloc
from pathlib import Path

import pytest

from umbp_sim.external.evidence import OTHERS_KEPT, PROBLEM, EvidenceReader
from umbp_sim.external.procs import frame
from umbp_sim.external.wire import MAX_DEPTH

from .exec_support import run_exec

STATS = {"routed": 3, "faults": 1, "moved": 0, "sim_fds": 0}
KERNEL = {"crash": None, "reasons": [], "trace": ["mmap(...) = 0x7f0000000000"]}


def _exit(pid: int, trace: list[str] | None = None) -> bytes:
    kernel = {**KERNEL, "trace": trace if trace is not None else KERNEL["trace"]}
    return frame(
        json.dumps({"event": "exit", "pid": pid, "stats": STATS, "kernel": kernel}).encode()
    )


NESTED = b"[" * 100_000 + b"]" * 100_000
BAD_FRAMES = {
    "nested 100,000 deep": (NESTED, f"a message nested deeper than {MAX_DEPTH}"),
    "Infinity in a count": (
        b'{"event": "exit", "pid": 7, "stats": {"routed": Infinity, "faults": 0, "moved": 0, '
        b'"sim_fds": 0}, "kernel": {"crash": null, "reasons": [], "trace": []}}',
        "a message with Infinity, which is no number",
    ),
    "a float pid": (
        b'{"event": "error", "pid": 7.5, "text": "x"}',
        "TypeError: pid: float, not int",
    ),
    "an int of 5,000 digits": (
        b'{"event": "error", "pid": ' + b"7" * 5000 + b', "text": "x"}',
        "a message with an integer of 5,000 digits",
    ),
    "a crash record of the wrong shape": (
        json.dumps(
            {
                "event": "death",
                "pid": 7,
                "signal": 7,
                "stage": "s",
                "kernel": {"crash": {"x": 1}, "reasons": [], "trace": []},
            }
        ).encode(),
        "KeyError: \"'x'\"",
    ),  # fmt: skip
    "a call site outside its table": (
        json.dumps(
            {
                "event": "death",
                "pid": 7,
                "signal": 7,
                "stage": "s",
                "kernel": {**KERNEL, "sites": [1], "call_sites": [["/x.so", 4]]},
            }
        ).encode(),
        "ValueError: sites: an entry that is not a call site's place",
    ),  # fmt: skip
    "more call sites than a trace keeps": (
        json.dumps(
            {
                "event": "death",
                "pid": 7,
                "signal": 7,
                "stage": "s",
                "kernel": {
                    **KERNEL,
                    "sites": [0],
                    "call_sites": [["/x.so", i] for i in range(1025)],
                },
            }
        ).encode(),
        "ValueError: call_sites: 1,025, more than 1024",
    ),  # fmt: skip
    "not JSON": (b"\x80\x04N.", "a message that is not UTF-8 text"),
}


@pytest.mark.parametrize("name", list(BAD_FRAMES))
def test_a_bad_frame_is_one_line_and_ends_the_reading(name: str) -> None:
    payload, why = BAD_FRAMES[name]
    reader = EvidenceReader(program=7)
    reader.feed(_exit(7))
    reader.feed(frame(payload) + _exit(7, ["after"]))
    assert reader.problem == f"{PROBLEM}: {why}"
    assert [e.trace for e in reader.exits] == [tuple(KERNEL["trace"])]  # read before it: kept


def test_the_records_of_other_processes_are_summarized_as_they_come() -> None:
    """A program that starts thousands of processes, each exiting with a long trace: umbp-sim
    keeps the program's record whole and a summary of at most OTHERS_KEPT others."""
    trace = [f"mmap(0x{i:x}, 4096) = 0x7f0000000000" for i in range(2000)]  # ~80 kB a frame
    one = _exit(100_000, trace)  # the pids below have as many digits: the frame's length holds
    tracemalloc.start()
    try:
        reader = EvidenceReader(program=7)
        for pid in range(100_000, 100_000 + 3 * OTHERS_KEPT):
            reader.feed(one.replace(b'"pid": 100000', f'"pid": {pid}'.encode()))
        reader.feed(_exit(7, trace))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert reader.problem is None
    mine = [e for e in reader.exits if e.pid == 7]
    others = [e for e in reader.exits if e.pid != 7]
    assert len(mine) == 1 and len(mine[0].trace) == 2000
    assert len(others) == OTHERS_KEPT and all(e.trace == () for e in others)
    assert reader.others_dropped == 2 * OTHERS_KEPT
    assert peak < 32 << 20, peak  # the frames were 240 MB together


# ---- through umbp-sim exec -----------------------------------------------------------------------

# The program writes the frame (hex; "TOKEN" in it replaced by the run's token, read from the
# host directory) on the evidence pipe named in its environment, then exits 3.
WRITER = (
    "import os, struct\n"
    "fd = int(os.environ['UMBP_SIM_EXEC_EVIDENCE'].split(':')[0])\n"
    "token = open(os.environ['UMBP_SIM_EXEC'] + '/token').read().encode()\n"
    "payload = bytes.fromhex({payload!r}).replace(b'TOKEN', token)\n"
    "os.write(fd, struct.pack('>I', len(payload)) + payload)\n"
    "os._exit(3)\n"
)
FROM_THE_PROGRAM = {
    "nested 100,000 deep": BAD_FRAMES["nested 100,000 deep"],
    "Infinity in a count": BAD_FRAMES["Infinity in a count"],
    "without the token": (
        json.dumps({"event": "error", "pid": 1, "text": "forged"}).encode(),
        "a frame without this run's token",
    ),
    "a float pid with the token": (
        b'{"token": "TOKEN", "event": "error", "pid": 7.5, "text": "x"}',
        "TypeError: pid: float, not int",
    ),
}


@pytest.mark.parametrize("name", list(FROM_THE_PROGRAM))
def test_a_bad_frame_from_the_program_keeps_its_exit_status(tmp_path: Path, name: str) -> None:
    payload, why = FROM_THE_PROGRAM[name]
    program = tmp_path / "writer.py"  # a file: the frame is past an argument's limit
    program.write_text(WRITER.format(payload=payload.hex()))
    done = run_exec(tmp_path, "--json", "r.json", "--", sys.executable, str(program))
    assert done.returncode == 3, done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert f"; {PROBLEM}: {why}" in done.stderr
    assert done.stderr.endswith("Exit status 3.\n")
    report = json.loads((tmp_path / "r.json").read_text())
    assert (report["exit_status"], report["evidence_problem"]) == (3, f"{PROBLEM}: {why}")


def test_the_interposers_frames_carry_the_runs_token(tmp_path: Path) -> None:
    """A program that exits normally: its exit frame (the interposer's, with the token) is read,
    so the report has the simulated host's counters and no problem line."""
    done = run_exec(tmp_path, "--json", "r.json", "--", sys.executable, "-c", "import os")
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["evidence_problem"] is None
    assert report["simulated_calls"] is not None
    assert PROBLEM not in done.stderr


def test_a_runs_process_keeps_its_last_death_only() -> None:
    """Under an allocator's server (no program pid) the run's process writes one death; frames
    the allocator forges there in numbers leave one record, the last."""
    death = {"event": "death", "pid": 5, "signal": 7, "stage": "page touch",
             "kernel": {"crash": None, "reasons": [], "trace": ["t"] * 1000}}  # fmt: skip
    reader = EvidenceReader()
    for _ in range(500):
        reader.feed(frame(json.dumps(death).encode()))
    reader.feed(frame(json.dumps({**death, "stage": "mmap"}).encode()))
    assert [d.stage for d in reader.deaths] == ["mmap"]
    assert reader.death is not None and reader.death.stage == "mmap"


def test_a_death_carries_its_calls_sites() -> None:
    """Each trace line's call site and their table (the interposer's records of where an
    external build's calls came from) come with the death; a frame without them has none."""
    kernel = {**KERNEL, "sites": [0], "call_sites": [["/b/x.so", 4660]]}
    reader = EvidenceReader()
    reader.feed(frame(json.dumps({"event": "death", "signal": 7, "stage": "alloc",
                                  "kernel": kernel}).encode()))  # fmt: skip
    assert reader.problem is None and reader.death is not None
    assert reader.death.trace_sites == (0,) and reader.death.call_sites == (("/b/x.so", 4660),)
    reader.feed(frame(json.dumps({"event": "death", "signal": 7, "stage": "alloc",
                                  "kernel": KERNEL}).encode()))  # fmt: skip
    assert reader.death.trace_sites == () and reader.death.call_sites == ()
