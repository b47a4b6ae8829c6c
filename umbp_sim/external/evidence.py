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

A program ``umbp-sim exec`` starts (``umbp_sim.external.exec_host``) writes on the same kind of
pipe, and every frame names the process (``pid``: a program the program execs or spawns writes
its own): a death, ``{"event": "exit", "pid", "stats", "kernel"}`` at a normal exit
(``ProgramExit``: the interposer's counters and the host's reasons and trace), and ``{"event":
"error", "pid", "text"}`` when the simulated host could not start (``SetupError``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from umbp_sim.external.procs import FrameError, FrameReader, signal_name
from umbp_sim.sim import Reason


@dataclass(frozen=True)
class KernelCrash:
    """SimKernel's record of the death: what faulted and what it needed."""

    signal: str  # "SIGBUS"
    where: str  # "prefault touch", "madvise(MADV_POPULATE_WRITE)", ...
    node: int | None  # the node the fault needed a page of, when known
    hugepage_size: int | None  # bytes, when a hugetlb page was needed
    detail: str  # "no free 2048 kB page on node 1 ..."
    text: str  # the whole account: "SIGBUS in prefault touch (node 1, 2048 kB pages): ..."


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


class EvidenceReader:
    """The frames of a run's evidence pipe, fed as they are read (``os.read``). What is not a
    well-formed frame of the interposer's ends the reading: the pipe is the interposer's, and
    only code in the run's own process could have written anything else."""

    def __init__(self) -> None:
        self._frames = FrameReader()
        self._broken = False
        self.death: Death | None = None  # the last death reported
        self.deaths: list[Death] = []  # every death, in order
        self.exits: list[ProgramExit] = []
        self.errors: list[SetupError] = []

    def feed(self, data: bytes) -> None:
        if self._broken:
            return
        try:
            for payload in self._frames.feed(data):
                event = event_from_json(json.loads(payload.decode(errors="replace")))
                if isinstance(event, Death):
                    self.death = event
                    self.deaths.append(event)
                elif isinstance(event, ProgramExit):
                    self.exits.append(event)
                else:
                    self.errors.append(event)
        except (FrameError, ValueError, TypeError, KeyError):
            self._broken = True


def _counts(doc: dict[str, Any]) -> InterposerCounts | None:
    stats = doc.get("stats")
    return None if stats is None else InterposerCounts(**{k: int(v) for k, v in stats.items()})


def event_from_json(doc: dict[str, Any]) -> Death | ProgramExit | SetupError:
    """The event of one frame (ValueError/TypeError/KeyError if malformed)."""
    event = doc["event"]
    if event == "death":
        return death_from_json(doc)
    if event == "exit":
        kernel = doc["kernel"]
        counts = _counts(doc)
        if counts is None:
            raise KeyError("stats")
        return ProgramExit(
            pid=int(doc["pid"]),
            counts=counts,
            reasons=tuple(Reason(**r) for r in kernel["reasons"]),
            trace=tuple(str(line) for line in kernel["trace"]),
        )
    if event == "error":
        return SetupError(pid=int(doc["pid"]), text=str(doc["text"]))
    raise ValueError(f"an evidence frame of event {event!r}")


def death_from_json(doc: dict[str, Any]) -> Death:
    """A ``Death`` from the interposer's frame (ValueError/TypeError/KeyError if malformed)."""
    if doc["event"] != "death":
        raise ValueError(f"an evidence frame of event {doc['event']!r}")
    kernel = doc["kernel"]
    crash = kernel["crash"]
    return Death(
        signal=signal_name(int(doc["signal"])),
        stage=str(doc["stage"]),
        crash=None if crash is None else KernelCrash(**crash),
        reasons=tuple(Reason(**r) for r in kernel["reasons"]),
        trace=tuple(str(line) for line in kernel["trace"]),
        pid=int(doc.get("pid", 0)),
        counts=_counts(doc),
    )
