"""The line an on-call engineer has: sglang's RuntimeError for a null handle, as a request.

    RuntimeError: UMBPHostMemAllocator.alloc(100000595968 bytes) failed
    (requested_backing=UMBPHostBufferBacking.AnonymousHugetlb, numa_node=3).

:func:`parse_error_line` finds it in one line or a whole pasted traceback (the last match wins:
a traceback ends with the exception; a paste hard-wrapped at the terminal's width is joined
back) and returns size, backing and node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from umbp_sim.errors import UmbpSimError
from umbp_sim.vocabulary.backing import BACKINGS
from umbp_sim.vocabulary.bounded import short_list
from umbp_sim.vocabulary.exit_codes import EX_USAGE

if TYPE_CHECKING:
    from umbp_sim.engine.record import RunRecord

_LINE = re.compile(
    r"UMBPHostMemAllocator\.alloc\((?P<size>\d+) bytes\) failed\s*"
    r"\(requested_backing=(?:UMBPHostBufferBacking\.)?(?P<backing>[A-Za-z]+),\s*"
    r"numa_node=(?P<node>-?\d+)\)\.?"
)


def _number(digits: str) -> str:
    """A number as written, bounded: ``99999999999999999999...(5000 digits)``."""
    return digits if len(digits) <= 24 else f"{digits[:20]}...({len(digits):,} digits)"


def _word(text: str) -> str:
    return text if len(text) <= 40 else f"{text[:30]}...({len(text):,} characters)"


class ErrorLineError(UmbpSimError):
    """Text that holds no ``UMBPHostMemAllocator.alloc(...) failed`` line."""

    exit_code = EX_USAGE


@dataclass(frozen=True)
class ErrorLine:
    size: int
    backing: str
    numa_node: int
    text: str  # the line as sglang formats it, "RuntimeError: " included

    def matches(self, record: RunRecord) -> bool:
        """Whether a run ended in this line: the alloc it names (size, backing, node) returned
        a null handle, the record's error (``RunRecord.null_alloc``): fields, never the text."""
        call = record.null_alloc
        return call is not None and (call.size, call.backing, call.numa_node) == (
            self.size,
            self.backing,
            self.numa_node,
        )


MAX_LINE = 64 << 10  # an error line, or any line of a paste, longer than this is not one
MAX_PASTE = 16 << 20  # a pasted traceback with its log lines: never a whole log
_BOUND = "a paste of the traceback"


def read_error_text(stream: IO[Any], where: str = "--error - (stdin)") -> str:
    """The text of ``--error -``: a pasted traceback read from ``stream`` (bytes, or text)
    line by line, bounded (a line longer than MAX_LINE, or more than MAX_PASTE in all, is an
    ErrorLineError naming ``where``, read no further: never a 200 MB stdin held in memory)."""
    chunks: list[str] = []
    total = 0
    while raw := stream.readline(MAX_LINE + 2):
        line = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        if len(line.rstrip("\r\n")) > MAX_LINE:
            raise ErrorLineError(
                f"{where}: a line longer than 64 KiB ({_BOUND}, not a log or a binary file)"
            )
        total += len(raw)
        if total > MAX_PASTE:
            raise ErrorLineError(f"{where}: more than 16 MiB ({_BOUND}, not a whole log)")
        chunks.append(line)
    return "".join(chunks)


def parse_error_line(text: str, where: str = "--error") -> ErrorLine:
    found = list(_LINE.finditer(text))
    if not found:  # a paste hard-wrapped at the terminal's width: the line split anywhere
        found = list(_LINE.finditer(re.sub(r"\r?\n", "", text)))
    if not found:
        raise ErrorLineError(
            f"{where}: no 'UMBPHostMemAllocator.alloc(N bytes) failed (requested_backing=..., "
            "numa_node=...)' line in it"
        )
    requests = {(m.group("size"), m.group("backing"), m.group("node")) for m in found}
    if len(requests) > 1:  # a log of several failures: which one to replay is the user's call
        listed = short_list(
            (f"alloc({_number(s)} bytes) {_word(b)} node {_number(n)}" for s, b, n in
             sorted(requests)), limit=3, show=str, sep="; ",
        )  # fmt: skip
        raise ErrorLineError(
            f"{where}: {len(requests):,} different failed allocations in it ({listed}): "
            "give the one to replay"
        )
    m = found[-1]
    backing = m.group("backing")
    if backing not in BACKINGS:
        raise ErrorLineError(
            f"{where}: requested_backing={_word(backing)} is not one of {', '.join(BACKINGS)}"
        )
    # Any size_t is replayed as the server printed it: alloc(size_t(-1)) is a field failure (a
    # negative size cast upstream), and from 2^62 bytes every mmap fails before any pages are
    # counted, so the simulator holds it (tests/test_hostile_inputs.py); beyond is no line.
    # int() refuses 4,300+ digits: the lengths are checked first (a size_t has 20 digits)
    size_text, node_text = m.group("size").lstrip("0") or "0", m.group("node")
    if len(size_text) > 20 or int(size_text) >= 2**64:
        raise ErrorLineError(f"{where}: {_number(size_text)} bytes does not fit a size_t")
    node_digits = node_text.lstrip("-").lstrip("0") or "0"
    if len(node_digits) > 10 or not -(2**31) <= int(node_text) < 2**31:
        raise ErrorLineError(f"{where}: numa_node={_number(node_text)} does not fit an int")
    size, node = int(size_text), int(node_text)
    line = (
        f"RuntimeError: UMBPHostMemAllocator.alloc({size} bytes) failed "
        f"(requested_backing=UMBPHostBufferBacking.{backing}, numa_node={node})."
    )
    return ErrorLine(size, backing, node, line)
