"""What a run's process says, read by whoever watches it: its server (a run given through the
server, or one that died) or its owner (a run the owner gave the process itself, the run's
lane: ``umbp_sim.external.runner``).

A run's process sends pickle frames on its pipe: ``{"stage": name, ...}`` when the stage board
is full (``procs.StageBoard``), then its last message, ``{"result": ...}`` or ``{"failed":
"..."}``, with what it posted (``"posted"``: its stage messages in order) and its own log
(``"log"``, read by :func:`read_log` just before it sends). What a watcher has read so far is a
``seen`` dict (:func:`new_seen`); :func:`take` adds frames to it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from umbp_sim.external.procs import FrameError, StageBoard, loads

LOG_LIMIT = 8 << 20  # bytes of a run's log read back: its head and its tail past that


def new_seen() -> dict[str, Any]:
    """What a watcher has read of a run: nothing yet."""
    return {"stages": [], "partial": {}, "result": None, "failed": None, "log": None}


def take_message(msg: Any, seen: dict[str, Any]) -> None:
    """One message of the run's into ``seen`` (anything that is not a dict is skipped)."""
    if not isinstance(msg, dict):
        return
    if "stage" in msg:
        seen["stages"].append(msg.pop("stage"))
        seen["partial"].update(msg)
    elif "result" in msg or "failed" in msg:
        if "result" in msg:
            seen["result"] = msg["result"]
        else:
            seen["failed"] = str(msg["failed"])
        if isinstance(msg.get("log"), str):
            seen["log"] = msg["log"]
        if isinstance(msg.get("posted"), list):  # all it posted: the board's and the pipe's
            seen["stages"], seen["partial"], seen["posted"] = [], {}, True
            for posted in msg["posted"]:
                take_message(dict(posted) if isinstance(posted, dict) else posted, seen)


def take(frames: Iterator[bytes], seen: dict[str, Any]) -> None:
    """The run's messages into ``seen``; what the allocator wrote on the run's pipe (it runs in
    that process) is skipped, and a frame past MAX_FRAME ends the reading of this feed."""
    try:
        for f in frames:
            try:
                msg = loads(f)
            except FrameError:  # not the child's: the allocator wrote on its pipe
                continue
            take_message(msg, seen)
    except FrameError:
        return


def take_board(board: StageBoard, seen: dict[str, Any]) -> None:
    """The stages the child posted on ``board`` into ``seen``, before those that came by the
    pipe (sent when the board was full); nothing when its last message said all it posted."""
    if seen.get("posted"):
        return
    late_stages, late_partial = seen["stages"], seen["partial"]
    seen["stages"], seen["partial"] = [], {}
    take(board.frames(), seen)
    seen["stages"] += late_stages
    seen["partial"].update(late_partial)


def ended(seen: dict[str, Any]) -> bool:
    """Whether the run sent its last message (its result, or the exception that ended it)."""
    return seen["result"] is not None or seen["failed"] is not None


def read_log(fd: int) -> str:
    """The log file ``fd`` as text, from its start (``pread``: its offset is left alone, so the
    process that writes it can read it too); past LOG_LIMIT its head and tail."""
    size = os.fstat(fd).st_size
    if size <= LOG_LIMIT:
        return _pread_all(fd, size, 0).decode(errors="replace")
    half = LOG_LIMIT // 2
    cut = f"\n[umbp-sim: {size - 2 * half} bytes of the log left out]\n".encode()
    head, tail = _pread_all(fd, half, 0), _pread_all(fd, half, size - half)
    return (head + cut + tail).decode(errors="replace")


def _pread_all(fd: int, n: int, offset: int) -> bytes:
    parts: list[bytes] = []
    while n > 0:
        data = os.pread(fd, n, offset)
        if not data:
            break
        parts.append(data)
        n, offset = n - len(data), offset + len(data)
    return b"".join(parts)
