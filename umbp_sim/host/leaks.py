"""Leak accounting at the end of a test: what is still held, as a list of one-line strings.

Sources, in any combination (``collect_leaks(*sources)``):
  - a kernel chain containing a ``_native.TracingKernel``: its leak ledger (the kernel-level
    record, csrc/kernel/leak_ledger.h), mappings made through it and not unmapped, memfds
    created through it and not closed, whatever the allocator's bookkeeping says;
  - an allocator (anything with ``snapshot() -> {"live": [...], "shm": [...]}``, i.e.
    ``umbp_sim.UMBPHostMemAllocator``): its own bookkeeping, buffers not freed, shm registry
    entries still held (including frees deferred by an active registration);
  - a simulated host (``umbp_sim.sim.SimHost``): simulated mappings, fds, and hugepage
    reservations above what the machine started with;
  - anything with a ``leaks() -> list[str]`` method: its lines as they are.
``assert_no_leaks(*sources)`` raises AssertionError listing them.
"""

from __future__ import annotations

from typing import Any

from umbp_sim import _native
from umbp_sim.host.trace import find_layer
from umbp_sim.vocabulary.units import format_size


def mapping_leaks(kernel: Any) -> list[str]:
    tk = find_layer(kernel, _native.TracingKernel)
    if tk is None:
        return []
    return [
        f"mapping {addr:#x} length {length} ({format_size(length)}) still mapped"
        for addr, length in tk.live_mappings()
    ]


def fd_leaks(kernel: Any) -> list[str]:
    tk = find_layer(kernel, _native.TracingKernel)
    if tk is None:
        return []
    return [f"fd {fd} still open" for fd in tk.open_fds()]


def allocator_leaks(allocator: Any) -> list[str]:
    snap = allocator.snapshot()
    out = []
    for b in snap["live"]:
        backing = getattr(b["backing"], "name", b["backing"])
        out.append(f"buffer {b['ptr']:#x} ({b['mapped_size']} bytes, {backing}) not freed")
    for e in snap["shm"]:
        state = " (free deferred)" if e["pending_free"] else ""
        out.append(
            f"shm registry entry {e['base']:#x} ({e['mapped_size']} bytes, fd {e['fd']}, "
            f"{e['active_registrations']} registration(s)){state} still held"
        )
    return out


def sim_leaks(host: Any) -> list[str]:
    out = [
        f"simulated mapping {m.start:#x} length {m.length} still mapped" for m in host.mappings()
    ]
    out += [f"simulated fd {fd} still open" for fd in host.open_fds()]
    for size in host.machine.hugepage_sizes:
        held = host.hugepages(size).reserved - host.machine.hugepages_reserved.get(size, 0)
        if held > 0:
            out.append(f"{held} hugepage reservation(s) of {format_size(size)} still held")
    return out


def collect_leaks(*sources: Any) -> list[str]:
    """Everything the sources still hold, one line each; [] when clean."""
    out: list[str] = []
    for src in sources:
        if src is None:
            continue
        known = False
        leaks = getattr(src, "leaks", None)
        if callable(leaks):
            out.extend(str(x) for x in leaks())
            known = True
        if callable(getattr(src, "snapshot", None)):
            out.extend(allocator_leaks(src))
            known = True
        if all(callable(getattr(src, a, None)) for a in ("mappings", "open_fds", "hugepages")):
            out.extend(sim_leaks(src))
            known = True
        if find_layer(src, _native.TracingKernel) is not None:
            out.extend(mapping_leaks(src))
            out.extend(fd_leaks(src))
        elif not known:
            raise TypeError(
                f"collect_leaks: {type(src).__name__} is not a traced kernel, an allocator, a "
                "simulated host, nor has leaks()"
            )
    return out


def assert_no_leaks(*sources: Any) -> None:
    leaks = collect_leaks(*sources)
    if leaks:
        raise AssertionError(f"{len(leaks)} leaked: " + "; ".join(leaks))
