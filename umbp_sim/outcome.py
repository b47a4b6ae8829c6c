"""What one allocation came to, as data: ``Outcome``, the one result type of an allocator run.

Every allocator answers with it: the built-in one in process (``umbp_sim.external.builtin``) and
an external build in its forked child (``umbp_sim.external.run_job``); ``compare`` puts two side
by side field by field. A scenario's richer record is ``umbp_sim.scenario.observed.Observed``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Outcome", "handle_fields"]


def handle_fields(h: Any) -> dict[str, Any]:
    """A ``UMBPHostBufferHandle``'s fields as data (either allocator's handle)."""
    backing = getattr(h.actual_backing, "name", str(h.actual_backing).split(".")[-1])
    return {
        "valid": bool(h),
        "ptr": int(h.ptr),
        "requested_size": int(h.requested_size),
        "mapped_size": int(h.mapped_size),
        "backing": backing,
        "alignment": int(h.actual_alignment),
    }


@dataclass
class Outcome:
    """What an allocator did in one run, as data.

    ``result`` is "ok" (a valid handle), "invalid" (a falsy handle), "error" (alloc raised:
    ``error`` holds the exception), "crash" (the process died: ``crash`` holds signal and stage;
    or stopped, SIGSTOP, and was ended), "timeout" (an external run went past its time limit:
    ``error`` says "timed out after 60 s in alloc", the last stage the run reported) or
    "could-not-run" (the harness failed: ``error`` says why).
    """

    result: str
    handle: dict[str, Any] | None = None  # valid, requested_size, mapped_size, backing, alignment
    crash: dict[str, Any] | None = None  # signal, stage, detail
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)
    leaks: dict[str, int] = field(default_factory=lambda: {"mappings": 0, "fds": 0})
    free_ok: bool | None = None
    binding: str | None = None  # NUMA policy and pages per node of a valid handle's mapping

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
