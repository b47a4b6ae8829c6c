"""Syscall traces: strace-like records of what the allocator asked of the kernel.

``instrument(kernel, plan)`` builds the usual stack, ``TracingKernel(FaultyKernel(kernel))``, so
the trace shows every call the allocator made, with injected answers marked ``(injected)``::

    mmap(NULL, 2097152, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_HUGETLB|MAP_HUGE_2MB,
         -1, 0) = -1 ENOMEM (injected)                                    (one line in the log)
    mmap(NULL, 2097152, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0) = 0x7f3a5c000000
    madvise(0x7f3a5c000000, 2097152, MADV_POPULATE_WRITE) = 0
    touch(0x7f3a5c000000, 2097152, 4096) = ? +++ killed by SIGBUS +++ (injected)

The records themselves are ``_native.TraceRecord`` (``seq``, ``op``, ``args`` dict, ``result``
SysResult, ``injected``, ``text()``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from umbp_sim import _native
from umbp_sim.faults import FaultPlan

TracingKernel = _native.TracingKernel
FaultyKernel = _native.FaultyKernel


@dataclass
class Instrumented:
    """The top of the stack to hand to an allocator, and the layers to inspect afterwards."""

    kernel: Any  # what the allocator calls: the TracingKernel
    tracing: Any  # _native.TracingKernel
    faulty: Any | None  # _native.FaultyKernel, None without a plan


def instrument(kernel: Any, plan: FaultPlan | None = None, limit: int = 100000) -> Instrumented:
    """``TracingKernel(FaultyKernel(kernel, plan))`` (no FaultyKernel when plan is None)."""
    faulty = plan.wrap(kernel) if plan is not None else None
    tracing = _native.TracingKernel(faulty if faulty is not None else kernel, limit)
    return Instrumented(tracing, tracing, faulty)


def find_layer(kernel: Any, cls: type) -> Any | None:
    """The first layer of type ``cls`` in a chain of wrappers (following ``.inner``)."""
    k = kernel
    while k is not None:
        if isinstance(k, cls):
            return k
        k = getattr(k, "inner", None)
    return None


def trace_text(kernel: Any, last: int | None = None) -> str:
    """The trace of the TracingKernel in ``kernel``'s chain, the ``last`` N lines if given;
    empty when there is none. Meant for failure reports."""
    tk = find_layer(kernel, _native.TracingKernel)
    if tk is None:
        return ""
    recs = tk.records()
    if last is not None:
        recs = recs[-last:] if last > 0 else []
    lines = [r.text() for r in recs]
    skipped = tk.dropped + (len(tk.records()) - len(recs))
    head = [f"... {skipped} earlier calls not shown"] if skipped else []
    return "\n".join(head + lines) + ("\n" if lines or head else "")


# Leaked mappings and fds whose making call a record names (a program that leaks thousands
# costs a few lines: the first ones say where).
MADE_BY_KEPT = 16


def made_by(
    records: list[Any], mappings: list[tuple[int, int]], fds: list[int]
) -> list[tuple[str, int]]:
    """Each of the first ``MADE_BY_KEPT`` leaked ``mappings`` ((address, length), as the
    ledger's ``live_mappings``) and ``fds`` with the index in ``records`` of the call that made
    it: the last successful mmap whose range holds the mapping's start, the last successful
    memfd_create that returned the fd; -1 when that call is not among the records (dropped).
    ``("fd 1000003", 4)``, ``("mapping 0x7f0000000000 length 4096", 2)``."""
    last_fd: dict[int, int] = {}
    maps: list[tuple[int, int, int]] = []  # (start, end, index) of each successful mmap
    for i, r in enumerate(records):
        if r.threw or not r.result.ok:
            continue
        if r.op == "memfd_create":
            last_fd[r.result.value] = i
        elif r.op == "mmap":
            maps.append((r.result.value, r.result.value + r.args["length"], i))
    out: list[tuple[str, int]] = []
    for fd in fds[:MADE_BY_KEPT]:
        out.append((f"fd {fd}", last_fd.get(fd, -1)))
    for addr, length in mappings[: MADE_BY_KEPT - len(out)]:
        made = [i for start, end, i in maps if start <= addr < end]
        out.append((f"mapping {addr:#x} length {length}", made[-1] if made else -1))
    return out
