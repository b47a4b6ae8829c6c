"""Exceptions umbp-sim raises to its users."""

from __future__ import annotations

from umbp_sim.vocabulary.exit_codes import EX_SIGHUP, EX_SIGTERM


class UmbpSimError(Exception):
    """Base of umbp-sim's own errors (bad input, bad dumps, bad scenario files).

    The command line prints one line: control characters (a quoted dump's included) escaped.
    An error whose first line is followed by a tool's own output (a compiler's) sets
    ``multiline = True`` to keep its line breaks."""

    multiline = False


class SimulatedCrash(RuntimeError):
    """The simulated process died: a SIGBUS on a hugetlb fault, an OOM kill (SIGKILL).

    Raised instead of a real signal. ``signal`` is the name ("SIGBUS"), ``where`` the operation
    that faulted ("prefault touch", "madvise(MADV_POPULATE_WRITE)"), ``node`` and
    ``hugepage_size`` (bytes) what the fault needed, when known.
    """

    def __init__(
        self,
        signal: str,
        where: str,
        node: int | None = None,
        hugepage_size: int | None = None,
        detail: str = "",
    ) -> None:
        self.signal = signal
        self.where = where
        self.node = node
        self.hugepage_size = hugepage_size
        self.detail = detail
        parts = [f"killed by {signal} during {where}"]
        if node is not None:
            parts.append(f"of node {node}")
        if hugepage_size is not None:
            parts.append(f"({hugepage_size // 1024} kB pages)")
        msg = " ".join(parts)
        if detail:
            msg += f": {detail}"
        super().__init__(msg)


class Terminated(BaseException):
    """SIGTERM or SIGHUP reached a command that starts processes (an external allocator's
    server, compare's workers): raised in its main thread so that its ``finally`` blocks end
    them; the command exits ``128 + signal`` (143, 129). A BaseException, as KeyboardInterrupt:
    no ``except Exception`` swallows it."""

    def __init__(self, sig: int) -> None:
        import signal

        self.signal = sig
        # 128 + the signal, as a shell reports a death by it (docs/commands.md lists both)
        self.exit_code = {int(signal.SIGTERM): EX_SIGTERM, int(signal.SIGHUP): EX_SIGHUP}.get(
            sig, 128 + sig
        )
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        self.name = name
        super().__init__(f"terminated by {name}")


class HostGoneError(RuntimeError):
    """A buffer handle was used after the simulated host it was allocated on was destroyed.

    A simulated buffer lives in its SimKernel's memory, which goes with the SimKernel (when the
    last of the SimHost, its allocators and their wrappers is gone): the handle's address then
    points to nothing. Raised by ``UMBPHostBufferHandle.ptr`` instead of a segmentation fault.
    """
