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

from umbp_sim.backing import BACKINGS
from umbp_sim.errors import UmbpSimError
from umbp_sim.value_types import short_list

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

    exit_code = 64


@dataclass(frozen=True)
class ErrorLine:
    size: int
    backing: str
    numa_node: int
    text: str  # the line as sglang formats it, "RuntimeError: " included

    def matches(self, error: str | None) -> bool:
        """Whether a simulated error is this exact line."""
        return (error or "").strip() == self.text


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
             sorted(requests)), limit=3, show=str,
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
