"""What one run of an allocator is (a simulated host, a fault plan, a request) and what came of it.

The same ``Run`` goes to the built-in allocator (in process) and to an external build (in a
forked child under the interposer); both answer with an ``Outcome``, so ``compare`` can put them
side by side field by field. ``Outcome`` is ``umbp_sim.outcome.Outcome``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from umbp_sim.faults import FaultPlan
from umbp_sim.machine import Machine
from umbp_sim.outcome import Outcome
from umbp_sim.request import AllocRequest

# ``alloc(size, backing, hugepage_size, numa_node, prefault)`` with mori's defaults: the one
# request type (umbp_sim/request.py), under the name the external runs have used.
AllocCall = AllocRequest

__all__ = ["AllocCall", "Outcome", "Run", "warning_lines"]


@dataclass(frozen=True)
class Run:
    """One process's life: allocate, write the first byte as a user would, free."""

    machine: Machine
    call: AllocCall
    plan: FaultPlan | None = None
    write: bool = True  # write the buffer's first byte after alloc (the user's first touch)
    free: bool = True
    label: str = ""
    env: tuple[tuple[str, str], ...] = ()  # set in the external allocator's process for the run


_LOG_PREFIX = re.compile(r"^(\[[^\]]*\]\s*)+")
_WARNING = re.compile(r"\bwarn(ing)?\b", re.IGNORECASE)


def warning_lines(text: str) -> list[str]:
    """Warnings in an allocator's log (stderr): lines that say warn/warning, prefixes removed
    (spdlog's ``[time] [pid] [umbp] [warning]``). The log is the allocator's alone: umbp-sim's
    evidence of a run comes on pipes of its own (``umbp_sim.external.evidence``)."""
    out = []
    for line in text.splitlines():
        if not _WARNING.search(line):
            continue
        line = _LOG_PREFIX.sub("", line.strip())
        line = re.sub(r"^\w+ \[warning\]\s*", "", line)
        out.append(line)
    return out
