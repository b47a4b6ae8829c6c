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

_LINE = re.compile(
    r"UMBPHostMemAllocator\.alloc\((?P<size>\d+) bytes\) failed\s*"
    r"\(requested_backing=(?:UMBPHostBufferBacking\.)?(?P<backing>[A-Za-z]+),\s*"
    r"numa_node=(?P<node>-?\d+)\)\.?"
)


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
        listed = "; ".join(f"alloc({s} bytes) {b} node {n}" for s, b, n in sorted(requests))
        raise ErrorLineError(
            f"{where}: {len(requests)} different failed allocations in it ({listed}): "
            "give the one to replay"
        )
    m = found[-1]
    backing = m.group("backing")
    if backing not in BACKINGS:
        raise ErrorLineError(f"{where}: requested_backing={backing} is not one of {BACKINGS}")
    size, node = int(m.group("size")), int(m.group("node"))
    if size >= 2**64:
        raise ErrorLineError(f"{where}: {size} bytes does not fit a size_t")
    if not -(2**31) <= node < 2**31:
        raise ErrorLineError(f"{where}: numa_node={node} does not fit an int")
    line = (
        f"RuntimeError: UMBPHostMemAllocator.alloc({size} bytes) failed "
        f"(requested_backing=UMBPHostBufferBacking.{backing}, numa_node={node})."
    )
    return ErrorLine(size, backing, node, line)
