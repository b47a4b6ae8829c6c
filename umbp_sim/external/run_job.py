"""One compare ``Run`` of an external allocator, in the forked child of its server.

The server (``umbp_sim.external.child``) forks once per job; a compare run travels as an
``ObserveJob`` that carries the ``Run`` (``observe.observe_one`` hands it here). The child sets
the run's environment, builds the simulated host, calls the allocator under the interposer,
writes the first byte as a user would, reads where the buffer is bound
(``umbp_sim.external.binding``) and frees it. A real signal ends the child; the server reports it.

Everything a run needs is imported when this module is (in the server, before it forks): an
import in the forked child would be paid again by every run.
"""

from __future__ import annotations

import ctypes
import gc
import os
import resource
from typing import Any

import umbp_sim.dump  # noqa: F401 - Machine's checks import it lazily: once here, not per fork
from umbp_sim import _native
from umbp_sim.external.binding import binding, pools_free
from umbp_sim.external.outcome import Run
from umbp_sim.machine import Machine
from umbp_sim.outcome import handle_fields
from umbp_sim.sim import build_kernel
from umbp_sim.trace import instrument


def no_room(machine: Machine, size: int) -> dict[str, int] | None:
    """In a run's process, before the allocator: whether SimKernel would give a buffer of
    ``size`` an unbacked address (this process has no real address space for it: its
    RLIMIT_AS, its memory), asked of a scratch SimKernel of the same host (``backed``).
    ``{"size": size, "limit": the soft RLIMIT_AS}`` then, else None. A page the allocator then
    touches by hand there is a real SIGSEGV: the analyst's limit, not a verdict."""
    if size <= 0:
        return None
    c = _native.constants
    kernel = build_kernel(machine)
    r = kernel.mmap(
        0, size, c["PROT_READ"] | c["PROT_WRITE"],
        c["MAP_PRIVATE"] | c["MAP_ANONYMOUS"] | c["MAP_NORESERVE"],
    )  # fmt: skip
    if not r.ok:
        return None  # the simulated host refuses it: nothing of it will be touched
    backed = kernel.backed(r.value)
    kernel.munmap(r.value, size)
    return None if backed else {"size": size, "limit": resource.getrlimit(resource.RLIMIT_AS)[0]}


def run_in_child(module: Any, ip: Any, run: Run, report: Any) -> dict[str, Any]:
    """``run`` on a fresh simulated host (in the forked child). Returns the result dict."""
    gc.disable()  # a short-lived fork: a collection would write to (copy) the server's heap
    os.environ.update(dict(run.env))  # the allocator reads it as in the field (getenv)
    kernel = build_kernel(run.machine)
    stack = instrument(kernel, run.plan)
    allocator = module.UMBPHostMemAllocator()
    backing = getattr(module.UMBPHostBufferBacking, run.call.backing)
    before = pools_free(kernel, run.machine)
    ip.activate(stack.kernel)
    out: dict[str, Any] = {"handle": None, "error": None, "free_ok": None, "binding": None}
    out["fault_path"] = ip.fault_path()  # how its page touches reach the Kernel
    c = run.call
    report("alloc", no_room=no_room(run.machine, c.size))
    try:
        with ip.scope():
            h = allocator.alloc(c.size, backing, c.hugepage_size, c.numa_node, c.prefault)
    except BaseException as e:  # noqa: BLE001 - the allocator's exception is the outcome
        out["error"] = f"{type(e).__name__}: {e}"
        h = None
    if h is not None:
        out["handle"] = handle_fields(h)
        if run.write and h:
            report("write")
            ctypes.memset(int(h.ptr), 1, 1)  # the user's first write (outside the scope)
        if h:
            out["binding"] = binding(kernel, run.machine, int(h.ptr), before)
        if run.free:
            report("free")
            try:
                with ip.scope():
                    allocator.free(h)
                out["free_ok"] = True
            except BaseException as e:  # noqa: BLE001
                out["free_ok"] = False
                out["error"] = f"free: {type(e).__name__}: {e}"
    report("exit")
    out["trace"] = [r.text() for r in stack.tracing.records()]
    out["leaks"] = {
        "mappings": len(stack.tracing.live_mappings()),
        "fds": len(stack.tracing.open_fds()),
    }
    ip.deactivate()
    return out
