"""What one run came to: ``RunRecord``, in one outcome vocabulary.

``outcome`` is one of:

- ``ok``: the allocator gave what was asked (every step's alloc did);
- ``demoted``: a valid buffer on 4 KiB pages where hugepages were asked
  (``umbp_sim.vocabulary.backing.is_demoted``);
- ``failed``: no buffer: ``failure`` says how: ``"invalid"`` (alloc returned a null handle:
  ``error`` is what sglang's wrapper raises for it) or ``"raised"`` (the allocator raised, or
  its free did: ``error`` is the exception, ``"free: ..."`` for a free);
- ``crashed``: the process died: ``signal`` (SIGBUS, SIGKILL; SIGSTOP: stopped, then ended by
  umbp-sim), ``stage`` (alloc, write, free, exit), ``simulated`` (SimKernel's signal, with
  ``crash_node`` and ``detail``) or a real one;
- ``timeout``: an external run went past ``--run-timeout``; ``error`` says "timed out after
  60 s in alloc" (the last stage it reported);
- ``could-not-run``: the harness failed (an external allocator's process died without a
  result): ``error`` says why.

A caller that cannot go on without a verdict raises them as the exceptions below:
``RunTimedOut`` (a run's ``timeout``), ``NoRoom`` (no real address space in umbp-sim's own
process for the buffer: no verdict) and their base, ``CouldNotRun``; the external runner raises
them too.

Scenario files' ``[expect].outcome`` uses the first four words; compare shows a record in its
own words (``umbp_sim.comparison.differences``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from umbp_sim.errors import UmbpSimError
from umbp_sim.request import AllocRequest
from umbp_sim.vocabulary.exit_codes import EX_FAILS, EX_TEMPFAIL
from umbp_sim.vocabulary.log_capture import LogEntry

__all__ = [
    "OUTCOMES",
    "CouldNotRun",
    "NoRoom",
    "RunRecord",
    "RunTimedOut",
    "handle_fields",
    "handle_record",
    "handle_state",
]

OUTCOMES = ("ok", "demoted", "failed", "crashed", "timeout", "could-not-run")


class CouldNotRun(UmbpSimError):
    """The allocator could not be loaded or its server died (compare: exit 2)."""

    exit_code = EX_FAILS  # compare's "could not run"


class RunTimedOut(CouldNotRun):
    """An external allocator's run (or its import) went past ``--run-timeout`` (replay,
    preflight: exit 75; compare: the allocator could not run, exit 2)."""

    exit_code = EX_TEMPFAIL


class NoRoom(CouldNotRun):
    """A run died of a real SIGSEGV/SIGBUS at an address SimKernel left unbacked because
    umbp-sim's own process has no real address space for the buffer (the analyst's RLIMIT_AS):
    not a verdict (replay, preflight: exit 75, as a run that could not end; compare: the
    allocator could not run, exit 2; run: the scenario fails with the line)."""

    exit_code = EX_TEMPFAIL


# What a record shows in JSON output (replay, compare, run --json), in this order.
JSON_FIELDS = (
    "outcome",
    "failure",
    "actual_backing",
    "mapped_size",
    "bound_node",
    "error",
    "signal",
    "stage",
    "crash_node",
    "warnings",
    "counters",
    "steps",
    "leaks",
)
TRACE_SHOWN = 40  # lines of the syscall trace a failure report shows


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


# Fields that name one process's objects (an address, an allocation's serial, a kernel's id, an
# fd's number): a record says whether each is set (not its null value), never the value, which
# differs from process to process and not between allocators.
IDENTITIES = {"ptr": 0, "serial": 0, "kernel_id": 0, "fd": -1}


def _field_names(h: Any) -> list[str]:
    """The fields a handle carries: the properties of its type (a pybind11 binding's, in the
    order it declares them), then the public attributes of the object itself (a handle written
    in Python)."""
    names: dict[str, None] = {}
    for cls in reversed(type(h).__mro__):
        names.update((n, None) for n, v in vars(cls).items() if isinstance(v, property))
    names.update((n, None) for n in getattr(h, "__dict__", {}) if not n.startswith("_"))
    return [n for n in names if not n.startswith("_")]


def _field_value(value: Any) -> Any:
    if hasattr(type(value), "__members__"):  # an enum (Python's or pybind11's): its name
        return str(getattr(value, "name", value)).rsplit(".", 1)[-1]
    if isinstance(value, bool | int | str | float) or value is None:
        return value
    return str(value)


def handle_record(h: Any) -> dict[str, Any]:
    """Everything a handle carries, as data: ``valid`` (its truth), then every field of the
    handle's type (either built-in allocator's handle: ptr, requested_size, mapped_size,
    actual_backing, actual_alignment, fd, numa_node, serial, kernel_id; an external build's:
    what its binding exposes), a backing by name, the ``IDENTITIES`` as ``"set"`` or their null
    value. compare reads it after alloc and after Free, field by field."""
    out: dict[str, Any] = {"valid": bool(h)}
    for name in _field_names(h):
        try:
            value = _field_value(getattr(h, name))
        except Exception as e:  # noqa: BLE001 - a field that cannot be read says so
            value = f"raised {type(e).__name__}"
        if name in IDENTITIES and isinstance(value, int):
            value = value if value == IDENTITIES[name] else "set"
        out[name] = value
    return out


def handle_state(h: Any) -> str:
    """A handle as Free left it, without its address (it differs from process to process):
    ``"invalid, ptr 0, mapped_size 0, requested_size 0"``."""
    ptr = "0" if int(h.ptr) == 0 else "set"
    return (
        f"{'valid' if bool(h) else 'invalid'}, ptr {ptr}, mapped_size {int(h.mapped_size)}, "
        f"requested_size {int(h.requested_size)}"
    )


@dataclass
class RunRecord:
    outcome: str
    failure: str | None = None  # "invalid" | "raised", when failed
    error: str | None = None
    # The alloc call whose null handle ``error`` is (failure "invalid"): sglang's error line is
    # made of its size, backing and node, and a replay compares those fields, not the text.
    null_alloc: AllocRequest | None = None
    # The (last) buffer: handle_fields, its backing and size, the node mbind bound it to (-1
    # none), and compare's account of its binding ("bind 1; hugepages 2 x 2MiB on node 1").
    handle: dict[str, Any] | None = None
    actual_backing: str | None = None
    mapped_size: int | None = None
    bound_node: int | None = None
    binding: str | None = None
    faulted: str | None = None  # the buffer's pages faulted when alloc returned ("1024 x 4KiB")
    mapping: str | None = None  # its VMA: "shared file rw, 4KiB pages" (engine.binding.mapping)
    handle_after_alloc: dict[str, Any] | None = None  # handle_record of what alloc returned
    after_free: dict[str, Any] | None = None  # handle_record as an Alloc's (first) Free left it
    # The shm registry's answer for the buffer after alloc and after its free ("found 4198400;
    # after free none"), where the allocator has the registry (engine.work.registry_probe).
    registry: str | None = None
    # A crash: the signal, where (stage), whether SimKernel raised it, its node and account.
    signal: str | None = None
    stage: str | None = None
    simulated: bool | None = None
    crash_node: int | None = None
    detail: str = ""
    warnings: list[str] = field(default_factory=list)
    # The allocator's own lines among the warnings (what mori's log would carry).
    allocator_warnings: list[str] = field(default_factory=list)
    # The level of each of ``allocator_warnings`` ("warning", "error", "critical"): compare's
    # "log level" (an empty list from a record that kept none: taken as all "warning").
    allocator_levels: list[str] = field(default_factory=list)
    # Every warning as (logger, warning id or None, text): sglang's own lines are under
    # "sglang.", the allocator's carry their ids (umbp_sim.vocabulary.log_capture).
    log: list[LogEntry] = field(default_factory=list)
    reasons: list[Any] = field(default_factory=list)  # SimKernel's (umbp_sim.sim.Reason)
    trace: list[str] = field(default_factory=list)  # every call through the TracingKernel
    trace_dropped: int = 0  # calls before ``trace`` the TracingKernel did not keep
    # Where each call of ``trace`` came from (an external build's, as the interposer saw it):
    # an index in ``call_sites`` or -1; both empty when no call has one (a built-in allocator).
    trace_sites: list[int] = field(default_factory=list)
    call_sites: list[tuple[str, int]] = field(default_factory=list)  # (object path, offset)
    # The call that made each mapping or fd the run left held: (what, its index in ``trace``,
    # -1 when not kept): ``umbp_sim.host.trace.made_by``.
    leaked_by: list[tuple[str, int]] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)  # what the run left held (umbp_sim.host.leaks)
    held: dict[str, int] = field(default_factory=lambda: {"mappings": 0, "fds": 0})
    counters: dict[str, int] = field(default_factory=dict)
    steps: list[str] = field(default_factory=list)
    budget: dict[str, int] | None = None  # what sglang's host check read
    # Several ranks on one host (Alloc.ranks, SglangStartup.ranks): each rank's outcome, error
    # and backing, in the order they started; the record's own fields are the worst rank's.
    ranks: list[dict[str, Any]] = field(default_factory=list)
    setup_notes: list[str] = field(default_factory=list)  # what the admin writes could not do
    host_state: Any = None  # umbp_sim.sim.HostState after the admin writes (Run.keep_state)
    state_after: Any = None  # and after the work, before the free (a run that did not crash)
    fault_path: str | None = None  # an external build's: how its page touches reached SimKernel
    # Measure runs (the real kernel): the page size, resident bytes, {node: pages}.
    page_size: int | None = None
    rss: int | None = None
    pages_on: dict[int, int] = field(default_factory=dict)

    def trace_text(self, last: int = TRACE_SHOWN) -> str:
        """The last ``last`` calls, one a line, after a line counting those not shown."""
        shown = self.trace[-last:] if last > 0 else []
        skipped = self.trace_dropped + len(self.trace) - len(shown)
        head = [f"... {skipped} earlier calls not shown"] if skipped else []
        return "\n".join(head + shown) + ("\n" if shown or head else "")

    def to_json(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in JSON_FIELDS}
