"""What a paste does not show and could change the answer: the request simulated on each side.

A paste without a kernel release is replayed on a recent kernel (the ``kernel-version-unknown``
note, ``umbp_sim/dump/paste.py``). The kernel calls the allocators make changed at three
releases (docs/kernel-model.md section 9): MADV_POPULATE_WRITE (5.14), memfd_create with
MFD_HUGETLB (4.14), memfd_create (3.17). ``other_sides`` re-runs the request just below each
edge and keeps each outcome that differs from the replay's, as a cause saying which kernels give
it and the command that settles it. A run that changes nothing is not shown.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from umbp_sim.diagnose.explain import Cause
from umbp_sim.diagnose.simulate import Simulation, simulate_request

if TYPE_CHECKING:
    from umbp_sim.diagnose.replay_request import Request
    from umbp_sim.dump import DumpFacts
    from umbp_sim.machine import Machine

# (the release that added it, the kernel simulated just below it, what it added)
KERNEL_EDGES = (
    ("5.14", "5.13.0", "MADV_POPULATE_WRITE"),
    ("4.14", "4.13.0", "memfd_create's MFD_HUGETLB"),
    ("3.17", "3.16.0", "memfd_create"),
)
CODE = "kernel-version-unknown"


def other_sides(
    machine: Machine, facts: DumpFacts | None, request: Request, run: Simulation, profile: str
) -> list[Cause]:
    """For a paste whose kernel is unknown: each older kernel's different outcome, simulated."""
    if facts is None or not any(n.code == CODE for n in facts.notes):
        return []
    seen = {(run.outcome, run.observed.actual_backing)}
    out = []
    for edge, version, added in KERNEL_EDGES:
        other = simulate_request(replace(machine, kernel_version=version), request, profile=profile)
        key = (other.outcome, other.observed.actual_backing)
        if key in seen:
            continue
        seen.add(key)
        out.append(
            Cause(
                f"if the kernel is older than {edge} (before {added}; the paste does not say, "
                f"simulated on {version}): {other.summary()}; `uname -r` settles it",
                "dump",
                note_code=CODE,
            )
        )
    return out
