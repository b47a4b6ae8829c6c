"""Leak accounting at the end of a test: what is still held, as a list of one-line strings.

Sources, in any combination (``collect_leaks(*sources)``):
  - a kernel chain containing a ``_native.TracingKernel``: mappings made through it and not
    unmapped, memfds created through it and not closed;
  - anything with a ``leaks() -> list[str]`` method (the allocator's shm registry and live
    buffers, a SimKernel's reservations): its lines are included as they are.
``assert_no_leaks(*sources)`` raises AssertionError listing them.
"""

from __future__ import annotations

from typing import Any

from umbp_sim import _native
from umbp_sim.trace import find_layer
from umbp_sim.units import format_size


def mapping_leaks(kernel: Any) -> list[str]:
    tk = find_layer(kernel, _native.TracingKernel)
    if tk is None:
        return []
    return [
        f"mapping {addr:#x} length {length} ({format_size(length)}) still mapped"
        for addr, length in tk.live_mappings()
    ]


def fd_leaks(kernel: Any) -> list[str]:
    tk = find_layer(kernel, _native.TracingKernel)
    if tk is None:
        return []
    return [f"fd {fd} still open" for fd in tk.open_fds()]


def collect_leaks(*sources: Any) -> list[str]:
    """Everything the sources still hold, one line each; [] when clean."""
    out: list[str] = []
    for src in sources:
        if src is None:
            continue
        leaks = getattr(src, "leaks", None)
        if callable(leaks):
            out.extend(str(x) for x in leaks())
        if find_layer(src, _native.TracingKernel) is not None:
            out.extend(mapping_leaks(src))
            out.extend(fd_leaks(src))
        elif not callable(leaks):
            raise TypeError(
                f"collect_leaks: {type(src).__name__} is neither a traced kernel nor has leaks()"
            )
    return out


def assert_no_leaks(*sources: Any) -> None:
    leaks = collect_leaks(*sources)
    if leaks:
        raise AssertionError(f"{len(leaks)} leaked: " + "; ".join(leaks))
