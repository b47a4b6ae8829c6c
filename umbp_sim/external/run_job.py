"""An engine ``Run`` of an external allocator, in the forked child of its server.

The server (``umbp_sim.external.child``) forks once per run; the child sets the run's
environment and performs it with the engine's ``execute`` (``umbp_sim.engine.execute``), the
allocator being ``ExternalSubject``: the build's module, each call in the interposer's scope,
the user's first write a real write (its fault goes to SimKernel by the interposer's fault
path). A real signal ends the child; the server reports it. A ``Measure`` run is the real
allocation (the interposer inactive): ``preflight --verify``.

Everything a run needs is imported when this module is (in the server, before it forks): an
import in the forked child would be paid again by every run.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import resource
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import umbp_sim.dump  # noqa: F401 - Machine's checks import it lazily: once here, not per fork
from umbp_sim import _native
from umbp_sim.engine.execute import execute, fresh_host, host_config
from umbp_sim.engine.measure import measure
from umbp_sim.engine.record import RunRecord
from umbp_sim.engine.spec import Measure, Run, SglangStartup
from umbp_sim.external.procs import dumps
from umbp_sim.machine import Machine
from umbp_sim.request import AllocRequest
from umbp_sim.sim import SimHost

MPOL_BIND = 2


def no_room(machine: Machine, size: int) -> dict[str, int] | None:
    """In a run's process, before the allocator: whether SimKernel would give a buffer of
    ``size`` an unbacked address (this process has no real address space for it: its
    RLIMIT_AS, its memory), asked of a scratch SimKernel of the same host (``backed``).
    ``{"size": size, "limit": the soft RLIMIT_AS}`` then, else None. A page the allocator then
    touches by hand there is a real SIGSEGV: the analyst's limit, not a verdict."""
    if size <= 0:
        return None
    c = _native.constants
    kernel = _native.SimKernel(host_config(machine))
    r = kernel.mmap(
        0, size, c["PROT_READ"] | c["PROT_WRITE"],
        c["MAP_PRIVATE"] | c["MAP_ANONYMOUS"] | c["MAP_NORESERVE"],
    )  # fmt: skip
    if not r.ok:
        return None  # the simulated host refuses it: nothing of it will be touched
    backed = kernel.backed(r.value)
    kernel.munmap(r.value, size)
    return None if backed else {"size": size, "limit": resource.getrlimit(resource.RLIMIT_AS)[0]}


def bound_node(host: SimHost, ptr: int) -> int:
    """The node the mapping at ``ptr`` is bound to (MPOL_BIND to one node), else -1."""
    m = host.mapping_at(ptr)
    if m is not None and m.policy_mode == MPOL_BIND and len(m.policy_nodes) == 1:
        return int(m.policy_nodes[0])
    return -1


# mori's C++-only shm registry as umbp-sim's binding (umbp_sim/bindings/mori_umbp_pybind.cpp)
# gives it, where the checkout's header declares it: the step op -> the module function.
REGISTRY_FUNCTIONS = {
    "lookup": "_umbp_sim_lookup_shm_allocation",
    "acquire": "_umbp_sim_acquire_shm_allocation",
    "release": "_umbp_sim_release_shm_allocation",
}


class ShmRecord(NamedTuple):
    """A registry answer of an external build (the binding gives a tuple) in the built-in
    allocators' shape (UMBPShmAllocation's fields)."""

    base: int
    mapped_size: int
    fd: int


def has_registry(module: Any) -> bool:
    """Whether ``module`` (an external build) has the shm registry functions."""
    return all(callable(getattr(module, f, None)) for f in REGISTRY_FUNCTIONS.values())


class _Scoped:
    """The build's allocator as the engine calls it: the backing by name, each call (the shm
    registry's too, where the build has it) in the interposer's scope."""

    def __init__(self, module: Any, ip: Any) -> None:
        self._module, self._ip = module, ip
        self._allocator = module.UMBPHostMemAllocator()

    def _registry(self, op: str, *args: int) -> Any:
        with self._ip.scope():
            return getattr(self._module, REGISTRY_FUNCTIONS[op])(*args)

    def lookup_shm_allocation(self, ptr: int, size: int) -> ShmRecord | None:
        found = self._registry("lookup", ptr, size)
        return None if found is None else ShmRecord(*found)

    def acquire_shm_allocation(self, ptr: int, size: int) -> ShmRecord | None:
        found = self._registry("acquire", ptr, size)
        return None if found is None else ShmRecord(*found)

    def release_shm_allocation(self, base: int) -> None:
        self._registry("release", base)

    def alloc(self, req: AllocRequest) -> Any:
        size, backing, hp, node, prefault = req.fields()
        enum = getattr(self._module.UMBPHostBufferBacking, backing)
        with self._ip.scope():
            return self._allocator.alloc(size, enum, hp, node, prefault)

    def free(self, handle: Any) -> None:
        with self._ip.scope():
            self._allocator.free(handle)


class ExternalSubject:
    """An external build in this (forked) process, under the interposer ``ip``."""

    harness_errors: tuple[type[BaseException], ...] = ()  # all it raises is the outcome

    def __init__(self, module: Any, ip: Any, machine: Machine, report: Callable[..., None]):
        self._module, self._ip, self._machine, self._report = module, ip, machine, report
        self.fault_path: str | None = None
        self.registry = has_registry(module)

    def attach(self, kernel: Any) -> None:
        self._ip.activate(kernel)
        self.fault_path = self._ip.fault_path()  # how its page touches reach the Kernel

    def detach(self, kernel: Any) -> None:
        self._ip.deactivate()

    def allocator(self) -> Any:
        return _Scoped(self._module, self._ip)

    def module(self) -> Any:
        return self._module

    def scope(self) -> contextlib.AbstractContextManager[Any]:
        return self._ip.scope()  # type: ignore[no-any-return]

    def write_first_byte(self, ptr: int) -> None:
        ctypes.memset(ptr, 1, 1)  # outside the scope: a user's write, its fault SimKernel's

    def bound_node(self, host: SimHost, handle: Any) -> int | None:
        return bound_node(host, int(handle.ptr))

    def stage(self, name: str, **extra: Any) -> None:
        if "size" in extra:  # the alloc: whether its buffer has real address space here
            extra = {"no_room": no_room(self._machine, extra.pop("size")), **extra}
        self._report(name, **extra)


def prepare(run: Run) -> bool:
    """In the server, before ``run`` is given to a child: what the run needs imported or built
    once (its host's SimConfig: the next child finds it; a child that lacks it builds it, a
    tenth of a millisecond). True when it imported something a child forked before would lack
    (torch, seconds a run): such a child is not used. A host that cannot be built is the run's
    failure, said by the child that tries it: the server goes on."""
    if not isinstance(run.work, Measure):
        try:
            host_config(run.machine)
        except Exception:  # noqa: BLE001 - the run's own (MachineError naming the field)
            pass
    if isinstance(run.work, SglangStartup):
        return load_torch()
    return False


def warm_up(ip: Any, run: Run) -> None:
    """In a child waiting for its run: what a run on ``run``'s host does short of calling the
    allocator (a simulated host built, the interposer activated on it and deactivated, a
    record encoded for the protocol). A forked process pays for every page it first writes (the
    server's copied); paid here, before the run arrives, it is not paid in the run's time. A
    host the last run could not use (its run said why) does not fail the next one here."""
    if isinstance(run.work, Measure):
        return
    gc.disable()
    try:
        host = fresh_host(run.machine)
        ip.activate(host.kernel)
        ip.deactivate()
        dumps(RunRecord(outcome="ok"))
    except Exception:  # noqa: BLE001 - a rehearsal: the run itself says what is wrong
        ip.deactivate()


def run_job(module: Any, ip: Any, run: Run, report: Callable[..., None]) -> dict[str, Any]:
    """``run`` in the forked child: ``{"record": RunRecord}``."""
    gc.disable()  # a short-lived fork: a collection would write to (copy) the server's heap
    if isinstance(run.work, Measure):  # the real allocation: the interposer stays inactive
        return {"record": measure(run.work.request, module.UMBPHostMemAllocator(),
                                  module.UMBPHostBufferBacking, True, report)}  # fmt: skip
    os.environ.update(dict(run.env))  # the allocator reads it as in the field (getenv)
    subject = ExternalSubject(module, ip, run.machine, report)
    record: RunRecord = execute(run, subject)
    record.fault_path = subject.fault_path
    return {"record": record}


_TORCH_TRIED: list[bool] = []  # load_torch was called in this process


def load_torch() -> bool:
    """Import torch in the server once (sglang's layer needs it; a forked child then has it).
    True when this call was the first (where torch is not installed the run says so)."""
    if _TORCH_TRIED or "torch" in sys.modules:
        return False
    _TORCH_TRIED.append(True)
    from umbp_sim.vocabulary._lsan import import_untracked

    import_untracked("numpy", "torch")  # under `tox -e asan`: their import leaks are not ours
    import umbp_sim.sglang  # noqa: F401

    return True
