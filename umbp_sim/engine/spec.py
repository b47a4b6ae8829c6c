"""What one run is, as data: ``Run`` (the host, a fault plan, the allocator, the work, the
environment, admin writes, counters to read). The same ``Run`` runs in process (a built-in
profile) or is sent to an external allocator's server (``umbp_sim.external.wire``: dataclasses
rebuilt field by field) and runs in its forked child (``umbp_sim.engine.execute``). It is plain
data: the admin writes in ``changes`` are values (``PoolWrite``, engine/host_changes.py) that
the engine applies; nothing in a Run is called.

The work is one of:

- ``Alloc``: one ``alloc`` call (``AllocRequest``); ``write`` writes the buffer's first byte as
  a user would (compare's runs), ``free`` frees it at the end (before the leak check);
  ``host_check`` runs sglang's host check on the call's size first;
- ``Steps``: a scenario's ``[request].steps`` (alloc, free, acquire/lookup/release, mapped,
  set_nr_hugepages);
- ``SglangStartup``: sglang's HiCache host-pool startup (its ``[request]`` table), released as
  ``release`` says (``[scenario].sglang``);
- ``Measure``: the real allocation on this host, measured and freed (``preflight --verify``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from umbp_sim.allocator_profiles import FIELD_PROFILE
from umbp_sim.engine.host_changes import HostChange
from umbp_sim.errors import UmbpSimError
from umbp_sim.faults import FaultPlan
from umbp_sim.machine import Machine
from umbp_sim.request import AllocRequest

__all__ = [
    "Alloc",
    "HostChange",
    "Measure",
    "Run",
    "RunError",
    "SglangStartup",
    "Steps",
    "Work",
]


class RunError(UmbpSimError):
    """The work cannot run as written (a step naming no earlier alloc, a counter that does not
    exist, a bad sglang table): the text names the scenario key (``[request].steps[2].id:
    ...``); a scenario puts its path in front."""


@dataclass(frozen=True)
class Alloc:
    request: AllocRequest
    write: bool = False  # write the first byte after alloc (the user's first touch)
    free: bool = True
    free_twice: bool = False  # then free the same handle again (a double free is a no-op)
    # sglang's host check first (requested <= MemAvailable - 10 GiB, as 0.5.23 performs it): the
    # call an sglang error line names was made only after that check passed, and a fix for it is
    # applied to a server that runs the check again.
    host_check: bool = False
    # sglang's ranks on one host (tp/dp), each a process with its own pool of this request, in
    # the order they start: every rank checks and allocates on the host the ranks before it left.
    ranks: int = 1
    # mori's DRAM tier: one more alloc in each rank's process after its pool (its UMBP store).
    dram_tier: AllocRequest | None = None


@dataclass(frozen=True)
class Steps:
    steps: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True)
class SglangStartup:
    request: Mapping[str, Any]  # the [request] table (model, sizes, ...)
    release: str | None = None  # [scenario].sglang: how the startup's buffers are released
    ranks: int = 1  # ranks on the host, each starting its own pool in turn (``Alloc.ranks``)
    dram_tier: AllocRequest | None = None  # each rank's DRAM tier after its pool (Alloc's)


@dataclass(frozen=True)
class Measure:
    """The allocation on the real kernel of this host, measured (page size, RSS, nodes)."""

    request: AllocRequest


Work = Alloc | Steps | SglangStartup | Measure


@dataclass(frozen=True)
class Run:
    """One process's life on one allocator: a fresh simulated host of ``machine`` (``changes``
    applied), ``plan``'s faults, the ``work``, then cleanup. ``allocator``: a profile name or
    an external SPEC (``umbp_sim.allocator_spec``); an allocator opened with
    ``run_router.open_allocator`` runs a Run as itself, whatever this field says (compare's runs
    go to both sides)."""

    machine: Machine
    work: Work
    allocator: str = FIELD_PROFILE
    plan: FaultPlan | None = None
    env: tuple[tuple[str, str], ...] = ()  # the allocator process's environment (and sglang's)
    changes: tuple[HostChange, ...] = ()
    counters: tuple[str, ...] = ()  # [expect].counters keys, read after the work, before cleanup
    label: str = ""
    # Keep the host's state after ``changes``, before the work (RunRecord.host_state), and after
    # the work (RunRecord.state_after, a fix's margin): a replay
    # asks it the questions that size its next fixes, instead of building a kernel to ask.
    keep_state: bool = False

    @property
    def request(self) -> AllocRequest | None:
        """The alloc request of an ``Alloc`` or ``Measure`` run, else None."""
        w = self.work
        return w.request if isinstance(w, (Alloc, Measure)) else None
