"""Frames written by allocator code on the protocols' fds are data within bounds (issue 43,
points 2 and 9; umbp_sim/external/wire.py).

An allocator's code runs in its server and can write on the server's channel to umbp-sim (its
fd is in the server's argv). Each frame here is small and once took umbp-sim's own process past
3 GiB or never returned when it was pickle; now each is one line, in a bounded time, with
umbp-sim's memory bounded: the command runs as a subprocess under a time limit of its own, and
its peak resident memory (its own and its children's, from wait4) is checked.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
from conftest import MORI_SURFACE

from umbp_sim.comparison.matrix import machine
from umbp_sim.engine.record import RunRecord
from umbp_sim.engine.spec import Alloc, Run, Steps
from umbp_sim.external.evidence import Death, KernelCrash
from umbp_sim.external.procs import FrameError, loads
from umbp_sim.external.wire import MAX_DEPTH, MAX_VALUES, decode, encode
from umbp_sim.faults import FaultPlan, FaultPlanError, FaultRule
from umbp_sim.request import AllocRequest
from umbp_sim.sim import Reason
from umbp_sim.vocabulary.units import Size

# ---- what pickle made of a few bytes -------------------------------------------------------------


def _pickled(expr: str) -> bytes:
    """The pickle that builds ``expr`` where it is loaded (written by hand: the attack)."""
    if expr == "bytearray":
        return b"\x80\x04cbuiltins\nbytearray\nJ\x00\x00\x00\x80\x85R."  # bytearray(2 GiB)
    if expr == "fraction":
        return b"\x80\x04cfractions\nFraction\nX\x0c\x00\x00\x001e1000000000\x85R."
    if expr == "frozenset":
        # frozenset(range(10**9))
        return b"\x80\x04cbuiltins\nfrozenset\ncbuiltins\nrange\nJ\x00\xca\x9a;\x85R\x85R."
    raise ValueError(expr)


# Tagged JSON that names a class outside umbp_sim, or one whose construction would act.
FRACTION = b'{"x":["fractions","Fraction",["1e1000000000"],[]]}'
HOSTILE = {
    "pickle bytearray(2 GiB)": (_pickled("bytearray"), "a message that is not UTF-8 text"),
    "pickle Fraction": (_pickled("fraction"), "a message that is not UTF-8 text"),
    "pickle frozenset(range)": (_pickled("frozenset"), "a message that is not UTF-8 text"),
    "Fraction by tag": (FRACTION, "a message naming fractions.Fraction, which is no umbp-sim data"),
    "bytearray by tag": (
        b'{"v":["builtins","bytearray",6442450944,[]]}',
        "a message naming builtins.bytearray, which is no umbp-sim data",
    ),
    "os.system by tag": (
        b'{"o":["umbp_sim.os","system",[]]}',
        "a message naming umbp_sim.os.system, which is no umbp-sim data",
    ),
    "an int of a million digits": (
        b'{"t":[' + b"9" * 1_000_000 + b"]}",
        "a message with an integer of 1,000,000 digits",
    ),
    "an int past 2^64": (b"18446744073709551616", "a message with an integer past 2^64"),
    "a float of a million digits": (
        b"0." + b"1" * 1_000_000,
        "a message with a number of 1,000,002 characters",
    ),
    "Infinity": (b"[Infinity]", "a message with Infinity, which is no number"),
    "NaN": (b"[NaN]", "a message with NaN, which is no number"),
    "1e400": (b"[1e400]", "a message with a number past a float's range"),
    "arrays nested 100,000 deep": (
        b"[" * 100_000 + b"]" * 100_000,
        f"a message nested deeper than {MAX_DEPTH}",
    ),
    "tuples nested past the bound": (
        b'{"t":[' * (MAX_DEPTH + 5) + b"]}" * (MAX_DEPTH + 5),
        f"a message nested deeper than {MAX_DEPTH}",
    ),
    "four million values": (
        b"[" + b"0," * (2 * MAX_VALUES) + b"0]",
        f"a message of more than {MAX_VALUES:,} values",
    ),
    "a dataclass's __init__ by tag": (
        b'{"o":["umbp_sim.engine.record","RunRecord",["__class__",1]]}',
        "a message with an attribute named '__class__'",
    ),
    "a list as a dict key": (
        b'{"d":[[1],2]}',
        "a message with a list as a key",
    ),
    "a class that is no data": (
        b'{"o":["umbp_sim.external.runner","ExternalRunner",[]]}',
        "a message naming umbp_sim.external.runner.ExternalRunner, which is no umbp-sim data",
    ),
    "a function": (
        b'{"o":["umbp_sim.external.procs","kill_group",[]]}',
        "a message naming umbp_sim.external.procs.kill_group, which is no umbp-sim data",
    ),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_payload_is_refused_in_bounded_time_and_memory(name: str) -> None:
    payload, said = HOSTILE[name]
    tracemalloc.start()
    start = time.monotonic()
    try:
        with pytest.raises(FrameError) as e:
            loads(payload)
        took = time.monotonic() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(e.value) == said
    assert took < 5, took
    assert peak < 16 * len(payload) + (8 << 20), peak  # a few copies of the frame, no more


def test_nothing_a_frame_names_is_called() -> None:
    """A dataclass is made without its __post_init__ (FaultRule's checks raise on this op), an
    int or str subclass without its __new__ (Note's raises on this code): what the frame holds
    comes back as it was, and nothing of the class ran."""
    from umbp_sim.dump.notes import Note

    rule = {"o": ["umbp_sim.faults", "FaultRule", ["op", "no-such-op"]]}
    back = loads(json.dumps(rule).encode())
    assert type(back) is FaultRule and back.op == "no-such-op"
    with pytest.raises(FaultPlanError):
        FaultRule(op="no-such-op")  # what __post_init__ would have said
    note = {"v": ["umbp_sim.dump.notes", "Note", "text", ["code", "no-such-code"]]}
    back = loads(json.dumps(note).encode())
    assert type(back) is Note and (back, back.code) == ("text", "no-such-code")
    with pytest.raises(ValueError):
        Note("no-such-code", "text")


def _run() -> Run:
    req = AllocRequest(Size(4 << 20, "MiB"), "AnonymousHugetlb", 2 << 20, 1, True)
    return Run(machine("pool-on-node0"), Alloc(req, write=True, dram_tier=req), plan=FaultPlan(()),
               env=(("A", "1"),), counters=("x",), label="l")  # fmt: skip


def test_umbp_sims_own_messages_come_back_as_they_were() -> None:
    run = _run()
    back = decode(encode(run))
    assert back == run
    assert type(back.work.request.size) is Size and back.work.request.size.unit == "MiB"
    steps = Run(machine("ample"), Steps(({"op": "alloc", "size": 4096},)))
    assert decode(encode(steps)) == steps
    rec = RunRecord("crashed", signal="SIGBUS", pages_on={0: 3, 1: 4}, held={"mappings": 1},
                    trace=["mmap(...) = 0x1"] * 3, log=[("a", None, "w")],
                    reasons=[Reason("touch", "r", None, "SIGBUS", {"n": 1}, "t")])  # fmt: skip
    back_rec = decode(encode({"result": {"record": rec}, "x": {1, 2}, "y": frozenset({"a"}),
                              "z": (b"\x00", float("inf"), -1.5)}))  # fmt: skip
    assert back_rec["result"]["record"] == rec
    assert back_rec["x"] == {1, 2} and back_rec["y"] == frozenset({"a"})
    assert back_rec["z"] == (b"\x00", float("inf"), -1.5)
    death = Death("SIGBUS", "page touch", KernelCrash("SIGBUS", "w", 1, None, "d", "t"), (), ())
    assert decode(encode(death)) == death


# ---- the same frames, written by an allocator on its server's channel to umbp-sim ----------------

# At import: the frame on the server's channel to umbp-sim (the second fd of the spec in argv).
WRITER = """
import ctypes, enum, json, mmap, os, struct, sys
_payload = {payload}
_out = json.loads(sys.argv[-1])["fds"][1]
os.write(_out, struct.pack(">I", len(_payload)) + _payload)


{surface}


class UMBPHostMemAllocator:
    def alloc(self, size, backing, hugepage_size=0, numa_node=-1, prefault=True):
        return Handle(mmap.mmap(-1, 4096), size)

    def free(self, h):
        pass
""".replace("{surface}", MORI_SURFACE)

CLI_FRAMES: dict[str, bytes | str] = {
    "pickle bytearray(2 GiB)": _pickled("bytearray"),
    "pickle Fraction": _pickled("fraction"),
    "Fraction by tag": FRACTION,
    "an int of a million digits": b'{"t":[' + b"9" * 1_000_000 + b"]}",
    "arrays nested 100,000 deep": b"[" * 100_000 + b"]" * 100_000,
    # issue 43 point 9: a well-formed message that is not one (pickle's None was exit 70)
    "None as the message": b"null",
    "a list as the message": b"[1, 2]",
    "a ready message of the wrong shape": json.dumps({"d": ["ready", True]}).encode(),
    # the largest frames the bounds let through, built by the allocator's code
    "a string of 60 MiB": "b'\"' + b'a' * (60 << 20) + b'\"'",
    "a million empty lists": "b'[' + b'[],' * ((1 << 20) - 3) + b'[]]'",
}


def _expr(frame: bytes | str) -> str:
    """The writer's expression of the frame: its bytes, or (str) code that makes them."""
    return frame if isinstance(frame, str) else f"bytes.fromhex({frame.hex()!r})"


def _umbp_sim(tmp_path: Path, *args: str, timeout: float = 60) -> tuple[int, str, str, int]:
    """``umbp-sim ARGS`` with tmp_path importable: (exit code, stdout, stderr, the peak resident
    KiB of it and what it waited for)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp_path), env.get("PYTHONPATH")) if p)
    env.pop("UMBP_SIM_TRACEBACK", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "umbp_sim.cli", *args], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, env=env, start_new_session=True, cwd=tmp_path,
    )  # fmt: skip
    deadline = time.monotonic() + timeout
    out, err = b"", b""
    assert proc.stdout is not None and proc.stderr is not None
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    sel.register(proc.stderr, selectors.EVENT_READ)
    while sel.get_map():
        left = deadline - time.monotonic()
        if left <= 0:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail(f"umbp-sim {' '.join(args)} still running after {timeout} s")
        for key, _ in sel.select(min(left, 0.5)):
            data = os.read(key.fd, 1 << 16)
            if not data:
                sel.unregister(key.fileobj)
            elif key.fileobj is proc.stdout:
                out += data
            else:
                err += data
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, out.decode(), err.decode(), usage.ru_maxrss


@pytest.mark.parametrize("name", list(CLI_FRAMES))
def test_a_frame_from_the_allocator_is_one_line_not_a_hang(tmp_path: Path, name: str) -> None:
    (tmp_path / "writer.py").write_text(WRITER.format(payload=_expr(CLI_FRAMES[name])))
    start = time.monotonic()
    code, out, err, peak_kib = _umbp_sim(
        tmp_path, "compare", "umbp-sim", "writer", "--matrix", "none", "-k", "node-63",
        "--run-timeout", "10",
    )  # fmt: skip
    took = time.monotonic() - start
    assert (code, out) == (2, ""), err
    assert len(err.splitlines()) == 1, err
    assert re.fullmatch(r"umbp-sim compare: writer: .*a message.*\n", err), err
    assert took < 30, took
    assert peak_kib < (1 << 20), peak_kib  # under 1 GiB: the frames asked for 2 and 6 GiB


def test_a_pickled_none_first_is_named(tmp_path: Path) -> None:
    """Issue 43 point 9: what once was exit 70 (None where the server's hello was due)."""
    (tmp_path / "writer.py").write_text(WRITER.format(payload=_expr(b"null")))
    code, _, err, _ = _umbp_sim(tmp_path, "compare", "umbp-sim", "writer", "--matrix", "none",
                                "-k", "node-63")  # fmt: skip
    assert code == 2
    assert err.endswith(
        "a message that is not umbp-sim's: a NoneType where a stage or the ready message was due\n"
    ), err
    assert pickle.dumps(None) not in err.encode()


def test_what_the_decoder_keeps_between_frames_is_bounded() -> None:
    """The decoder keeps the classes and attributes it has checked (a run's messages name the
    same ones again and again); frames naming 20,000 attributes leave at most its bound."""
    from umbp_sim.external import wire

    for n in range(4):
        names = [v for i in range(5000) for v in (f"a{n}_{i}", i)]
        doc = {"o": ["umbp_sim.engine.record", "RunRecord", names]}
        rec = loads(json.dumps(doc).encode())
        assert getattr(rec, f"a{n}_4999") == 4999
    assert len(wire._ATTRS) <= wire._CACHE_MAX and len(wire._CLASSES) <= wire._CACHE_MAX


# A thread the allocator's import leaves in its server writes a frame on the server's channel
# once a run has begun (alloc, in the run's process, leaves a mark first and then sleeps): the
# frame reaches umbp-sim where the run's reply was due.
LATE_WRITER = """
import atexit, ctypes, enum, json, mmap, os, struct, sys, threading, time
_MARK = {mark!r}
_out = json.loads(sys.argv[-1])["fds"][1]


def _forge():
    while not os.path.exists(_MARK):
        time.sleep(0.01)
    os.write(_out, struct.pack(">I", 4) + b"null")


# Joined at exit: a daemon thread still taking the GIL back after its write when the server
# finalizes is ended by CPython mid-call, leaving its start record behind (LeakSanitizer in
# `tox -e asan` reports it as the server's leak).
_t = threading.Thread(target=_forge, daemon=True)
_t.start()
atexit.register(_t.join, 5)


{surface}


class UMBPHostMemAllocator:
    def alloc(self, size, backing, hugepage_size=0, numa_node=-1, prefault=True):
        open(_MARK, "w").close()
        time.sleep(30)
        return Handle(mmap.mmap(-1, 4096), size)

    def free(self, h):
        pass
""".replace("{surface}", MORI_SURFACE)


def test_a_forged_reply_ends_the_server_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "late.py").write_text(LATE_WRITER.format(mark=str(tmp_path / "mark")))
    start = time.monotonic()
    code, out, err, _ = _umbp_sim(tmp_path, "compare", "umbp-sim", "late", "--matrix", "none",
                                  "-k", "node-63", "--run-timeout", "20")  # fmt: skip
    assert time.monotonic() - start < 20  # not the run's 30 s sleep, nor its time limit
    assert (code, out) == (2, ""), err
    assert err == (
        "umbp-sim compare: late: the allocator's server was ended: its channel to umbp-sim "
        "carried a message that is not umbp-sim's: a NoneType where a run's reply was due\n"
    )
