"""The allocator under test as a run drives it: ``Subject``.

``BuiltinSubject`` is umbp-sim's own allocator with a policy profile, in this process, on the
run's kernel stack; an external build's is ``umbp_sim.external.run_job.ExternalSubject``, in
the forked child of its server, each call inside the interposer's scope. The run itself
(``umbp_sim.engine.execute``) is the same code for both.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any, Protocol

from umbp_sim import _context
from umbp_sim.allocator import UMBPHostMemAllocator
from umbp_sim.errors import SimulatedCrash
from umbp_sim.mori_compat import mori_module
from umbp_sim.request import AllocRequest
from umbp_sim.sim import SimHost


class Subject(Protocol):
    # Exceptions out of an allocator call that are the harness's, never the allocator's outcome.
    harness_errors: tuple[type[BaseException], ...]
    # Whether the allocator has mori's shm registry calls (lookup, acquire, release).
    registry: bool

    def attach(self, kernel: Any) -> None:
        """Route the allocator's OS calls to ``kernel`` (the run's TracingKernel) from now on."""

    def detach(self, kernel: Any) -> None: ...

    def allocator(self) -> Any:
        """A fresh allocator: ``alloc(AllocRequest)``, ``free(handle)`` (and, built in, the shm
        registry calls of steps)."""

    def module(self) -> Any:
        """What sglang imports as ``mori.umbp``."""

    def scope(self) -> contextlib.AbstractContextManager[Any]:
        """The block in which the allocator's own calls run (sglang's startup)."""

    def write_first_byte(self, ptr: int) -> None:
        """The user's first write to the buffer (a crash here is the stage "write")."""

    def bound_node(self, host: SimHost, handle: Any) -> int | None:
        """The node the buffer is bound to (-1 none; None: not known)."""

    def stage(self, name: str, **extra: Any) -> None:
        """The run reached ``name`` ("alloc", "write", "lookup", "free", "exit"); ``extra``: what a
        death from here on leaves its parent (an external run's)."""


class _Builtin:
    def __init__(self, kernel: Any, profile: str) -> None:
        self._a = UMBPHostMemAllocator(kernel=kernel, profile=profile)

    def alloc(self, req: AllocRequest) -> Any:
        return self._a.alloc(*req.args())

    def __getattr__(self, name: str) -> Any:  # free and the shm registry calls
        return getattr(self._a, name)

    def snapshot(self) -> Any:  # what umbp_sim.host.leaks reads of the allocator's bookkeeping
        return self._a.snapshot()


class BuiltinSubject:
    """umbp-sim's allocator with ``profile``, in this process."""

    harness_errors: tuple[type[BaseException], ...] = (SimulatedCrash,)
    registry = True  # both built-in allocators keep mori's registry

    def __init__(self, profile: str) -> None:
        self.profile = profile
        self._kernel: Any = None

    def attach(self, kernel: Any) -> None:
        self._kernel = kernel
        _context.push_kernel(kernel)  # sglang's mori.umbp allocates on the active kernel

    def detach(self, kernel: Any) -> None:
        _context.pop_kernel(kernel)

    def allocator(self) -> Any:
        return _Builtin(self._kernel, self.profile)

    def module(self) -> Any:
        return mori_module(self.profile)

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        yield

    def write_first_byte(self, ptr: int) -> None:
        r = self._kernel.touch(ptr, 1, 1)
        if r.signal:
            raise SimulatedCrash(_signal_name(r.signal), "user write")

    def bound_node(self, host: SimHost, handle: Any) -> int | None:
        return getattr(handle, "numa_node", None)  # mori's handle has none

    def stage(self, name: str, **extra: Any) -> None:
        pass


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"
