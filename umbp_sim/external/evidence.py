"""What the interposer hands umbp-sim when a simulated signal ends a run's process.

A run's process (forked by the allocator's server, ``umbp_sim.external.child``) gets a pipe of
its own for this and gives its write end to the interposer
(``Interposer.set_evidence_fd``: close-on-exec, closed in the process's forks). When the Kernel
answers a call or a page touch with a signal (SIGBUS, an OOM SIGKILL), the interposer writes one
frame there before the process dies of it (csrc/interposer/death.cpp): a 4-byte big-endian
length, then a JSON object ``{"event": "death", "signal": <number>, "stage": ..., "kernel":
{"crash": ..., "reasons": [...], "trace": [...]}}``. The server reads the pipe while the run
goes and puts the decoded ``Death`` in its reply. Nothing of this goes through the allocator's
stdout or stderr (its log), so whatever the allocator prints cannot pass for it.

A program ``umbp-sim exec`` starts (``umbp_sim.exec_host.machine_dir``) writes on the same kind of
pipe, and every frame names the process (``pid``: a program the program execs or spawns writes
its own): a death, ``{"event": "exit", "pid", "stats", "kernel"}`` at a normal exit
(``ProgramExit``: the interposer's counters and the host's reasons and trace), and ``{"event":
"error", "pid", "text"}`` when the simulated host could not start (``SetupError``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from umbp_sim.external.procs import FrameError, FrameReader, signal_name
from umbp_sim.external.wire import WireError, plain
from umbp_sim.sim import Reason
from umbp_sim.vocabulary.bounded import shown


@dataclass(frozen=True)
class KernelCrash:
    """SimKernel's record of the death: what faulted and what it needed. Its fields are the
    declared ones (``_native.CRASH_FIELDS``: csrc/kernel/sim_kernel.h's UMBP_SIM_CRASH_FIELDS),
    then ``text``, the whole account."""

    signal: str  # "SIGBUS"
    where: str  # "prefault touch", "madvise(MADV_POPULATE_WRITE)", ...
    node: int | None  # the node the fault needed a page of, when known
    hugepage_size: int | None  # bytes, when a hugetlb page was needed
    detail: str  # "no free 2048 kB page on node 1 ..."
    text: str  # the whole account: "SIGBUS in prefault touch (node 1, 2048 kB pages): ..."

    def fields(self) -> dict[str, Any]:
        """The declared fields by name, as ``SimulatedCrash`` takes them."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "text"}


@dataclass(frozen=True)
class InterposerCounts:
    """The interposer's counters in a process when it wrote a frame."""

    routed: int  # calls answered by the simulated host
    faults: int  # page faults of simulated mappings handled
    moved: int  # runs of real pages moved (the resident limit reached)
    sim_fds: int  # simulated fds open


@dataclass(frozen=True)
class Death:
    """A run's process killed by a simulated signal, as the interposer saw it."""

    signal: str  # the simulated signal's name ("SIGBUS", "SIGKILL")
    stage: str  # where the thread was: "page touch" or the call ("mmap", "madvise", ...)
    crash: KernelCrash | None  # None: no SimKernel record (a fault rule injected the signal)
    reasons: tuple[Reason, ...]  # SimKernel's reasons, the death's among them
    trace: tuple[str, ...]  # the syscall trace, one line per call
    pid: int = 0  # the process that died
    counts: InterposerCounts | None = None
    # Each trace line's call site (an index in call_sites, -1 none) and the sites (object path,
    # offset): where an external build's calls came from (RunRecord.trace_sites, call_sites).
    trace_sites: tuple[int, ...] = ()
    call_sites: tuple[tuple[str, int], ...] = ()

    @property
    def detail(self) -> str:
        """SimKernel's account of the death, or "injected"."""
        return self.crash.text if self.crash is not None else "injected"


@dataclass(frozen=True)
class ProgramExit:
    """A process of a program ``umbp-sim exec`` started that exited normally (exit())."""

    pid: int
    counts: InterposerCounts
    reasons: tuple[Reason, ...]  # SimKernel's reasons: every failed call and deciding event
    trace: tuple[str, ...]


@dataclass(frozen=True)
class SetupError:
    """The simulated host of a process could not start (the process exited 70)."""

    pid: int
    text: str


# Records kept of the processes a program started beyond the program itself (exec): one
# summary each (a death's trace and all but its last reasons dropped), at most this many.
OTHERS_KEPT = 1000
OTHER_REASONS_KEPT = 3
TEXT_KEPT = 4096  # characters of a text field kept (a trace line, a reason, a setup error)
PROBLEM = "a frame on the evidence channel was not umbp-sim's"


class EvidenceReader:
    """The frames of a run's evidence pipe, fed as they are read (``os.read``). What is not a
    well-formed frame of the interposer's ends the reading and is said once (``problem``: "a
    frame on the evidence channel was not umbp-sim's: ..."): the pipe is the interposer's, and
    only code in the run's own process could have written anything else. Each frame is read
    within bounds (``umbp_sim.external.wire.plain``: size, values, nesting, numbers; NaN and
    Infinity refused) and its fields checked before anything is built.

    ``program``: the pid of the program ``umbp-sim exec`` started. Its last death and exit are
    kept whole; every other process's records are summarized as they arrive (a death without
    its trace, an exit as its counters), at most ``OTHERS_KEPT`` of them (``others_dropped``
    counts the rest), so a program that starts thousands of processes costs umbp-sim a few
    hundred bytes each. None (a run's process under an allocator's server, whose forks write
    none): its last event of each kind kept.

    ``token``: the run's (exec: ``exec_host.HostDir.token``, which the interposer puts first in
    every frame); a frame without it is not the interposer's."""

    def __init__(self, program: int | None = None, token: str | None = None) -> None:
        self._frames = FrameReader()
        self._broken = False
        self._program = program
        self._token = token
        self.death: Death | None = None  # the last death reported
        self.deaths: list[Death] = []  # the deaths kept (above), in order
        self.exits: list[ProgramExit] = []
        self.errors: list[SetupError] = []
        self._others_kept = 0
        self.others_dropped = 0  # records of other processes past OTHERS_KEPT
        self.problem: str | None = None  # the bad frame that ended the reading

    def feed(self, data: bytes) -> None:
        if self._broken:
            return
        try:
            for payload in self._frames.feed(data):
                doc = plain(payload)
                if self._token is not None and (
                    not isinstance(doc, dict) or doc.get("token") != self._token
                ):
                    raise WireError("a frame without this run's token")
                self._take(event_from_json(doc))
        except (FrameError, WireError, ValueError, TypeError, KeyError) as e:
            self._broken = True
            why = str(e) if isinstance(e, (FrameError, WireError)) else f"{type(e).__name__}: {e}"
            self.problem = f"{PROBLEM}: {' '.join(why.split())[:300]}"

    def _take(self, event: Death | ProgramExit | SetupError) -> None:
        mine = self._program is None or event.pid == self._program
        if not mine:
            if self._others_kept >= OTHERS_KEPT:
                self.others_dropped += 1
                return
            self._others_kept += 1
            event = _summary(event)
        elif self._program is None:  # a run's process: its last event of each kind
            if isinstance(event, Death):
                self.deaths = []
            elif isinstance(event, ProgramExit):
                self.exits = []
            else:
                self.errors = []
        else:  # the program's own: its last of each kind
            if isinstance(event, Death):
                self.deaths = [d for d in self.deaths if d.pid != event.pid]
            elif isinstance(event, ProgramExit):
                self.exits = [e for e in self.exits if e.pid != event.pid]
        if isinstance(event, Death):
            if mine:
                self.death = event
            self.deaths.append(event)
        elif isinstance(event, ProgramExit):
            self.exits.append(event)
        else:
            self.errors.append(event)


def _summary(event: Death | ProgramExit | SetupError) -> Death | ProgramExit | SetupError:
    """Another process's record without what only the program's report shows."""
    if isinstance(event, Death):
        reasons = event.reasons[-OTHER_REASONS_KEPT:]
        return dataclasses.replace(event, reasons=reasons, trace=(), trace_sites=(), call_sites=())
    if isinstance(event, ProgramExit):
        return dataclasses.replace(event, reasons=(), trace=())
    return event


def _field(doc: Any, key: str, kind: type, none: bool = False) -> Any:
    """``doc[key]``, checked to be a ``kind`` (an int that is no bool; None when ``none``);
    a text cut at TEXT_KEPT characters. TypeError/KeyError otherwise."""
    if not isinstance(doc, dict):
        raise TypeError(f"{key}: in something that is not an object")
    value: Any = doc[key]
    if value is None and none:
        return None
    if type(value) is not kind:
        raise TypeError(f"{key}: {type(value).__name__}, not {kind.__name__}")
    checked: Any = value
    if kind is int and checked < 0:
        raise ValueError(f"{key}: a negative number")
    return checked[:TEXT_KEPT] if kind is str else checked


def _list(doc: Any, key: str) -> list[Any]:
    return list(_field(doc, key, list))


def _reason(r: Any) -> Reason:
    numbers = _field(r, "numbers", dict)
    for k, v in numbers.items():
        if type(v) is not int:
            raise TypeError(f"numbers.{shown(k)}: {type(v).__name__}, not int")
    return Reason(
        call=_field(r, "call", str),
        rule=_field(r, "rule", str),
        errno=_field(r, "errno", str, none=True),
        signal=_field(r, "signal", str, none=True),
        numbers=dict(numbers),
        text=_field(r, "text", str),
    )


def _kernel(doc: Any) -> tuple[tuple[Reason, ...], tuple[str, ...]]:
    kernel = _field(doc, "kernel", dict)
    reasons = tuple(_reason(r) for r in _list(kernel, "reasons"))
    trace = _list(kernel, "trace")
    for line in trace:
        if type(line) is not str:
            raise TypeError(f"trace: a {type(line).__name__}, not str")
    return reasons, tuple(line[:TEXT_KEPT] for line in trace)


MAX_CALL_SITES = 1024  # the TracingKernel's bound (csrc/kernel/tracing_kernel.h)


def _sites(doc: Any, lines: int) -> tuple[tuple[int, ...], tuple[tuple[str, int], ...]]:
    """The trace's call sites (absent from an older interposer's frame: none): one index per
    line, each -1 or a place in the table of at most MAX_CALL_SITES [object, offset] pairs."""
    kernel = _field(doc, "kernel", dict)
    if "sites" not in kernel and "call_sites" not in kernel:
        return (), ()
    table = []
    for pair in _list(kernel, "call_sites"):
        if type(pair) is not list or len(pair) != 2 or type(pair[0]) is not str:
            raise TypeError("call_sites: an entry that is not [object, offset]")
        if type(pair[1]) is not int or pair[1] < 0:
            raise TypeError("call_sites: an offset that is not a number")
        table.append((pair[0][:TEXT_KEPT], pair[1]))
    if len(table) > MAX_CALL_SITES:
        raise ValueError(f"call_sites: {len(table):,}, more than {MAX_CALL_SITES}")
    sites = _list(kernel, "sites")
    if len(sites) != lines:
        raise ValueError(f"sites: {len(sites):,} for {lines:,} trace lines")
    for s in sites:
        if type(s) is not int or not -1 <= s < len(table):
            raise ValueError("sites: an entry that is not a call site's place")
    return tuple(sites), tuple(table)


def _counts(doc: dict[str, Any]) -> InterposerCounts | None:
    stats = doc.get("stats")
    if stats is None:
        return None
    return InterposerCounts(
        **{k: _field(stats, k, int) for k in ("routed", "faults", "moved", "sim_fds")}
    )


def event_from_json(doc: Any) -> Death | ProgramExit | SetupError:
    """The event of one frame (ValueError/TypeError/KeyError if malformed)."""
    event = _field(doc, "event", str)
    if event == "death":
        return death_from_json(doc)
    if event == "exit":
        counts = _counts(doc)
        if counts is None:
            raise KeyError("stats")
        reasons, trace = _kernel(doc)
        return ProgramExit(pid=_field(doc, "pid", int), counts=counts, reasons=reasons,
                           trace=trace)  # fmt: skip
    if event == "error":
        return SetupError(pid=_field(doc, "pid", int), text=_field(doc, "text", str))
    raise ValueError(f"an evidence frame of event {shown(event)}")


def death_from_json(doc: Any) -> Death:
    """A ``Death`` from the interposer's frame (ValueError/TypeError/KeyError if malformed)."""
    if _field(doc, "event", str) != "death":
        raise ValueError(f"an evidence frame of event {shown(doc['event'])}")
    crash = _field(_field(doc, "kernel", dict), "crash", dict, none=True)
    reasons, trace = _kernel(doc)
    trace_sites, call_sites = _sites(doc, len(trace))
    return Death(
        signal=signal_name(_field(doc, "signal", int)),
        stage=_field(doc, "stage", str),
        crash=None if crash is None else _crash(crash),
        reasons=reasons,
        trace=trace,
        pid=_field(doc, "pid", int) if "pid" in doc else 0,
        counts=_counts(doc),
        trace_sites=trace_sites,
        call_sites=call_sites,
    )


def _crash(c: dict[str, Any]) -> KernelCrash:
    extra = sorted(set(c) - {f.name for f in dataclasses.fields(KernelCrash)})
    if extra:
        raise KeyError(shown(extra[0]))
    return KernelCrash(
        signal=_field(c, "signal", str),
        where=_field(c, "where", str),
        node=_field(c, "node", int, none=True),
        hugepage_size=_field(c, "hugepage_size", int, none=True),
        detail=_field(c, "detail", str),
        text=_field(c, "text", str),
    )
