"""An external run's process is forked ahead of its run (``child.Forker``): each run is still a
fresh fork of the server, what it reports reaches the reply, and no process outlives its
server. The allocator here is a small Python module with mori's surface that writes down, for
each alloc, its process and how many allocs that process made before."""

from __future__ import annotations

import copy
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import MORI_SURFACE

from umbp_sim.allocator_spec import parse_allocator_spec
from umbp_sim.comparison.matrix import machine
from umbp_sim.engine.spec import Alloc, Run
from umbp_sim.external import runner as runner_module
from umbp_sim.external.observe import record_from_reply
from umbp_sim.external.procs import StageBoard
from umbp_sim.external.runner import ExternalRunner
from umbp_sim.request import AllocRequest

ALLOCATOR = """
import ctypes, enum, mmap, os, time

CALLS = 0  # allocs made in this process before
LOG = {log!r}


{surface}

class UMBPHostMemAllocator:
    def alloc(self, size, backing, hugepage_size=0, numa_node=-1, prefault=True):
        global CALLS
        with open(LOG, "a") as f:
            f.write(f"{{os.getpid()}} {{os.getpgrp()}} {{CALLS}}\\n")
        CALLS += 1
        if size == 12288:
            time.sleep(1e6)  # past the run's limit: ended in its stage
        return Handle(mmap.mmap(-1, max(4096, size)), size)

    def free(self, h):
        pass
""".replace("{surface}", MORI_SURFACE)


@pytest.fixture
def counted(tmp_path: Path) -> Iterator[tuple[ExternalRunner, Path]]:
    log = tmp_path / "allocs"
    (tmp_path / "counted_alloc.py").write_text(ALLOCATOR.format(log=str(log)))
    runner = ExternalRunner(
        parse_allocator_spec("counted_alloc"), env={"PYTHONPATH": str(tmp_path)}, run_timeout=2
    )
    try:
        yield runner, log
    finally:
        runner.close()


def _run(size: int) -> Run:
    return Run(machine("pool-on-node0"), Alloc(AllocRequest(size, "Anonymous")))


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        text = Path(f"/proc/{pid}/task/{task}/children").read_text()
        out += [int(c) for c in text.split()]
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_each_run_is_a_fresh_fork_in_a_group_of_its_own(
    counted: tuple[ExternalRunner, Path],
) -> None:
    runner, log = counted
    records = [record_from_reply(runner.observe(_run(4096 * (1 + i % 2)))) for i in range(6)]
    assert [r.outcome for r in records] == ["ok"] * 6
    assert runner.proc is not None
    server = runner.proc.pid
    lines = [line.split() for line in log.read_text().splitlines()]
    pids = [int(p) for p, _, _ in lines]
    # one process each, none the server; the allocator never called before in it (the spare's
    # warm-up does not call it), each the leader of the run's own group
    assert len(set(pids)) == 6 and server not in pids
    assert [int(calls) for _, _, calls in lines] == [0] * 6
    assert all(int(pgrp) == int(pid) for pid, pgrp, _ in lines)


def test_the_next_runs_process_waits_in_the_servers_group_and_ends_with_it(
    counted: tuple[ExternalRunner, Path],
) -> None:
    runner, _ = counted
    assert record_from_reply(runner.observe(_run(4096))).outcome == "ok"
    assert runner.proc is not None
    server = runner.proc.pid
    deadline = time.monotonic() + 10
    spares: list[int] = []
    while not spares and time.monotonic() < deadline:  # forked while the run ran
        spares = [c for c in _children(server) if _alive(c) and os.getpgid(c) == server]
        time.sleep(0.01)
    assert len(spares) == 1  # the keeper is in a group of its own
    runner.close()
    deadline = time.monotonic() + 10
    while _alive(spares[0]) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _alive(spares[0])


def test_without_forking_ahead_no_process_waits(tmp_path: Path) -> None:
    # The benchmark's baseline (ExternalRunner(fork_ahead=False)): a run's process is forked on
    # its arrival, so after a run the server has no child in its own group.
    log = tmp_path / "allocs"
    (tmp_path / "counted_alloc.py").write_text(ALLOCATOR.format(log=str(log)))
    spec = parse_allocator_spec("counted_alloc")
    runner = ExternalRunner(spec, env={"PYTHONPATH": str(tmp_path)}, fork_ahead=False)
    try:
        records = [record_from_reply(runner.observe(_run(4096))) for _ in range(3)]
        assert [r.outcome for r in records] == ["ok"] * 3
        assert runner.proc is not None
        server = runner.proc.pid
        time.sleep(0.2)
        assert [c for c in _children(server) if _alive(c) and os.getpgid(c) == server] == []
        assert len({line.split()[0] for line in log.read_text().splitlines()}) == 3
    finally:
        runner.close()


def test_a_host_the_last_run_could_not_use_does_not_fail_the_next_run(
    counted: tuple[ExternalRunner, Path],
) -> None:
    # The next run's process warms up on the last run's host while that run runs: a host that
    # cannot be built is the last run's failure, not the next one's.
    runner, log = counted
    bad = copy.deepcopy(machine("pool-on-node0"))
    bad.nodes[0].mem_total = -5
    reply = runner.observe(Run(bad, Alloc(AllocRequest(4096, "Anonymous"))))
    assert "mem_total" in str(reply["failed"])
    records = [record_from_reply(runner.observe(_run(4096))) for _ in range(2)]
    assert [(r.outcome, r.error) for r in records] == [("ok", None)] * 2
    assert len(log.read_text().splitlines()) == 2  # the bad host's run never reached alloc


def test_a_run_past_its_limit_names_the_stage_it_posted(
    counted: tuple[ExternalRunner, Path],
) -> None:
    runner, _ = counted
    rec = record_from_reply(runner.observe(_run(12288)))
    assert (rec.outcome, rec.error) == ("timeout", "timed out after 2 s in alloc")
    assert record_from_reply(runner.observe(_run(4096))).outcome == "ok"  # the next one goes on


def test_a_stage_board_keeps_whole_frames_in_order_and_says_when_full() -> None:
    board = StageBoard()
    try:
        assert list(board.frames()) == []
        assert board.post(b"alloc") and board.post(b"free")
        assert list(board.frames()) == [b"alloc", b"free"]
        big = b"x" * (StageBoard.SIZE // 2)
        assert board.post(big)
        assert not board.post(big)  # it would not fit: the caller sends it by the pipe
        assert list(board.frames()) == [b"alloc", b"free", big]
    finally:
        board.close()


def test_a_board_a_child_scribbled_on_reads_as_far_as_it_is_whole() -> None:
    board = StageBoard()
    try:
        board.post(b"alloc")
        board._mem[:4] = (1 << 31).to_bytes(4, "big")  # a used count past the board
        assert list(board.frames())[:1] == [b"alloc"]
        board._mem[:4] = (2).to_bytes(4, "big")  # one inside its own header
        assert list(board.frames()) == []
    finally:
        board.close()


def test_stages_that_do_not_fit_on_the_board_come_by_the_pipe_in_order(tmp_path: Path) -> None:
    # The server here has a board too small for any stage (sitecustomize shrinks it before
    # umbp-sim starts): every stage goes by the run's pipe, and the reply is the same.
    log = tmp_path / "allocs"
    (tmp_path / "counted_alloc.py").write_text(ALLOCATOR.format(log=str(log)))
    piped = tmp_path / "piped"
    (tmp_path / "sitecustomize.py").write_text(
        "from umbp_sim.external.procs import StageBoard\n"
        "StageBoard.SIZE = 8\n"
        "_post = StageBoard.post\n"
        "def post(self, payload):\n"
        "    ok = _post(self, payload)\n"
        f"    if not ok: open({str(piped)!r}, 'a').write('pipe\\n')\n"
        "    return ok\n"
        "StageBoard.post = post\n"
    )
    runner = ExternalRunner(
        parse_allocator_spec("counted_alloc"), env={"PYTHONPATH": str(tmp_path)}, run_timeout=2
    )
    try:
        first = runner.observe(_run(4096))
        assert first["stages"] == ["alloc", "free", "exit"]
        assert record_from_reply(first).outcome == "ok"
        assert piped.read_text().count("pipe") == 3  # none fitted on the board
        late = record_from_reply(runner.observe(_run(12288)))  # its last stage came by the pipe
        assert (late.outcome, late.error) == ("timeout", "timed out after 2 s in alloc")
    finally:
        runner.close()


# Libraries the server must not hold: each module it holds makes every fork of it dearer
# (tempfile's shutil and random, fractions' decimal, tomllib's datetime, subprocess: 0.6 ms a
# fork together, measured). An allocator that imports them brings them; this one does not.
NOT_IN_THE_SERVER = ("_bz2", "_lzma", "_random", "_sha512", "_decimal", "_datetime",
                     "_posixsubprocess", "zlib")  # fmt: skip


def test_the_server_holds_none_of_the_libraries_a_run_does_not_need(
    counted: tuple[ExternalRunner, Path],
) -> None:
    runner, _ = counted
    assert record_from_reply(runner.observe(_run(4096))).outcome == "ok"
    assert runner.proc is not None
    maps = Path(f"/proc/{runner.proc.pid}/maps").read_text()
    loaded = {os.path.basename(line.split()[-1]).split(".")[0] for line in maps.splitlines()}
    assert "_json" in loaded  # what a run needs is there (the protocol's decoder)
    assert sorted(loaded & set(NOT_IN_THE_SERVER)) == []


def test_a_run_that_ends_its_process_itself_is_told_by_the_server(tmp_path: Path) -> None:
    # An allocator that ends its process itself (exit status 3, after a line on stderr), and
    # one killed by a real signal: no result, so its exit status and its log say how it ended,
    # and the next run goes on.
    (tmp_path / "quitter.py").write_text(QUITTER.replace("{surface}", MORI_SURFACE))
    runner = ExternalRunner(parse_allocator_spec("quitter"), env={"PYTHONPATH": str(tmp_path)})
    try:
        gone = record_from_reply(runner.observe(_run(4096)))
        assert (gone.outcome, gone.error) == ("could-not-run", "quitter: leaving now")
        killed = record_from_reply(runner.observe(_run(8192)))
        assert (killed.outcome, killed.signal, killed.stage) == ("crashed", "SIGUSR1", "alloc")
        assert record_from_reply(runner.observe(_run(12288))).outcome == "ok"  # and on it goes
    finally:
        runner.close()


QUITTER = """
import ctypes, enum, mmap, os, signal, sys


{surface}

class UMBPHostMemAllocator:
    def alloc(self, size, backing, hugepage_size=0, numa_node=-1, prefault=True):
        if size == 4096:
            sys.stderr.write("quitter: leaving now\\n")
            sys.stderr.flush()
            os._exit(3)
        if size == 8192:
            os.kill(os.getpid(), signal.SIGUSR1)
        return Handle(mmap.mmap(-1, size), size)

    def free(self, h):
        pass
"""


def test_a_server_that_stops_answering_is_a_timeout_and_the_next_run_starts_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A server past its run's limit and its own grace is ended and its run reported as timed
    # out in "the allocator's server" (TimeoutError is an OSError: it was once reported as
    # "the allocator's server died"); the next run has a new server.
    monkeypatch.setattr(runner_module, "SERVER_GRACE", 0.5)
    (tmp_path / "counted_alloc.py").write_text(ALLOCATOR.format(log=str(tmp_path / "allocs")))
    spec = parse_allocator_spec("counted_alloc")
    runner = ExternalRunner(spec, env={"PYTHONPATH": str(tmp_path)}, run_timeout=1)
    try:
        assert record_from_reply(runner.observe(_run(4096))).outcome == "ok"
        assert runner.proc is not None
        stopped = runner.proc.pid
        os.kill(stopped, signal.SIGSTOP)
        rec = record_from_reply(runner.observe(_run(4096)))
        assert (rec.outcome, rec.error) == (
            "timeout", "timed out after 1.5 s in the allocator's server",
        )  # fmt: skip
        assert record_from_reply(runner.observe(_run(4096))).outcome == "ok"
        assert runner.proc is not None and runner.proc.pid != stopped
        assert not _alive(stopped)
    finally:
        runner.close()
