"""A run's log (``run_log.RunLog``): a pipe the server drains, keeping the head and the tail,
so an allocator that prints without end costs a bounded amount of memory, and what it printed
first and last still reaches the reply."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import MORI_SURFACE

from umbp_sim.allocator_spec import parse_allocator_spec
from umbp_sim.comparison.matrix import machine
from umbp_sim.engine.spec import Alloc, Run
from umbp_sim.external.observe import record_from_reply
from umbp_sim.external.run_log import LOG_LIMIT, RunLog
from umbp_sim.external.runner import ExternalRunner
from umbp_sim.request import AllocRequest


def test_a_short_log_is_kept_whole() -> None:
    log = RunLog(limit=16)
    try:
        for part in (b"abc", b"defgh", b"ij", b""):
            log.feed(part)
        assert log.text() == "abcdefghij"
    finally:
        log.close()


def test_a_long_log_keeps_head_and_tail_and_counts_the_rest() -> None:
    log = RunLog(limit=8)
    try:
        data = bytes(range(97, 123)) * 3  # 78 bytes: a..z three times
        for i in range(0, len(data), 5):
            log.feed(data[i : i + 5])
        assert log.text() == "abcd\n[umbp-sim: 70 bytes of the log left out]\nwxyz"
    finally:
        log.close()


def test_memory_stays_bounded_whatever_is_written() -> None:
    log = RunLog(limit=1 << 20)
    try:
        chunk = b"x" * (1 << 16)
        most = 0
        for _ in range(1600):  # 100 MiB
            log.feed(chunk)
            most = max(most, log.kept())
        assert most <= (1 << 20) // 2 * 3 + len(chunk)
        assert "103809024 bytes of the log left out" in log.text()
    finally:
        log.close()


def test_drain_stops_when_the_pipe_is_empty_or_the_budget_spent() -> None:
    log = RunLog()
    try:
        os.write(log.wfd, b"before the end\n")
        log.drain()  # the writer is still open: it returns at an empty pipe, not at an end
        assert log.text() == "before the end\n"
        os.write(log.wfd, b"y" * 1000)
        log.drain(budget=100)
        assert len(log.text()) == len("before the end\n") + 100
    finally:
        log.close()


FLOODER = """
import ctypes, enum, mmap, os, stat


{surface}

class UMBPHostMemAllocator:
    def alloc(self, size, backing, hugepage_size=0, numa_node=-1, prefault=True):
        kind = "a pipe" if stat.S_ISFIFO(os.fstat(1).st_mode) else "not a pipe"
        os.write(1, f"flooder [warning] first line, on {kind}\\n".encode())
        junk = b"." * 1023 + b"\\n"
        for _ in range(size):
            os.write(2, junk)
        os.write(1, b"flooder [warning] last line\\n")
        return Handle(mmap.mmap(-1, 4096), 4096)

    def free(self, h):
        pass
""".replace("{surface}", MORI_SURFACE)


def test_an_allocator_that_floods_its_log_keeps_its_first_and_last_warning(
    tmp_path: Path,
) -> None:
    (tmp_path / "flooder.py").write_text(FLOODER)
    runner = ExternalRunner(parse_allocator_spec("flooder"), env={"PYTHONPATH": str(tmp_path)})
    try:
        kib = 3 * LOG_LIMIT >> 10  # three times what is kept, in lines of 1 KiB
        run = Run(machine("pool-on-node0"), Alloc(AllocRequest(kib, "Anonymous")))
        reply = runner.observe(run)
        lines = "flooder [warning] first line, on a pipe\nflooder [warning] last line\n"
        written = kib * 1024 + len(lines)
        left = written - LOG_LIMIT
        assert f"\n[umbp-sim: {left} bytes of the log left out]\n" in reply["log"]
        assert len(reply["log"]) < LOG_LIMIT + 100
        record = record_from_reply(reply)
        assert record.outcome == "ok"
        assert record.warnings == ["first line, on a pipe", "last line"]
    finally:
        runner.close()
