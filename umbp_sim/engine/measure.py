"""A ``Measure`` run: the allocation on the real kernel of this host, measured and freed
(``preflight --verify``'s reality).

The allocator is the request's profile on ``LinuxKernel`` in a child process of its own
(``python -m umbp_sim.engine.measure``, printing JSON: :func:`measure_in_child`), or an
external build in a forked run of its server with the interposer inactive
(``umbp_sim.external.run_job``). The child measures the buffer (page size: smaps'
KernelPageSize; RSS: its resident bytes by mincore(2); nodes: the numa_maps entry holding it)
and frees it. A child killed by a signal is ``crashed``.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from umbp_sim.engine.record import RunRecord, handle_record
from umbp_sim.engine.spec import Measure, Run
from umbp_sim.engine.work import backing_name, null_handle_error
from umbp_sim.errors import UmbpSimError
from umbp_sim.request import AllocRequest
from umbp_sim.vocabulary.backing import alloc_outcome
from umbp_sim.vocabulary.child_python import module_argv
from umbp_sim.vocabulary.log_capture import capture_logs

MEASURE_TIMEOUT = 300.0  # seconds the built-in allocator's child may take


def _smaps_entry(addr: int) -> dict[str, int]:
    """The smaps fields (kB) of the mapping that holds ``addr``."""
    fields: dict[str, int] = {}
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(maxsplit=1)[0]
            if "-" in head and ":" not in head:
                if inside:
                    break
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head.endswith(":"):
                parts = line.split()
                if len(parts) >= 2 and parts[1].isdigit():
                    fields[head[:-1]] = int(parts[1])
    return fields


def _resident(addr: int, length: int) -> int:
    """Bytes of [addr, addr+length) in memory (mincore(2)): smaps' Rss would count a
    neighbouring mapping the kernel merged with the buffer's."""
    libc = ctypes.CDLL(None, use_errno=True)
    page = os.sysconf("SC_PAGE_SIZE")
    n = (length + page - 1) // page
    vec = (ctypes.c_ubyte * n)()
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    if libc.mincore(addr, length, vec) != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(b & 1 for b in bytes(vec)) * page


def _numa_maps_entry(addr: int) -> list[str]:
    """The words of the numa_maps entry that holds ``addr`` (the last one starting below), or
    [] when none does."""
    best: tuple[int, list[str]] | None = None
    with open("/proc/self/numa_maps") as f:
        for line in f:
            tok = line.split()
            start = int(tok[0], 16) if tok else addr + 1
            if start <= addr and (best is None or start > best[0]):
                best = (start, tok)
    return best[1] if best else []


def _pages_on(addr: int) -> dict[int, int]:
    """{node: pages} of the numa_maps entry that holds ``addr``."""
    out: dict[int, int] = {}
    for t in _numa_maps_entry(addr)[2:]:
        key, eq, value = t.partition("=")
        if eq and key[:1] == "N" and key[1:].isdigit() and value.isdigit():
            out[int(key[1:])] = int(value)
    return out


def _bound_node(addr: int) -> int:
    """The node of the numa_maps entry holding ``addr`` when its policy binds to one, else -1."""
    entry = _numa_maps_entry(addr)
    policy = entry[1] if len(entry) > 1 else ""
    nodes = policy.removeprefix("bind:")
    return int(nodes) if policy.startswith("bind:") and nodes.isdigit() else -1


def measure(
    req: AllocRequest,
    allocator: Any,
    backings: Any,
    external: bool,
    report: Callable[..., None] = lambda stage: None,
) -> RunRecord:
    """``req`` on ``allocator`` (its ``UMBPHostBufferBacking`` enum: ``backings``) on this
    process's kernel, measured and freed; ``report``: the stages (an external build's run)."""
    report("alloc")
    h = allocator.alloc(
        req.size, getattr(backings, req.backing), req.hugepage_size, req.numa_node, req.prefault
    )
    if not h:
        rec = RunRecord("failed", failure="invalid")
        rec.error = null_handle_error(req.size, req.backing, req.numa_node)
        rec.null_alloc = req
        return rec
    report("measure")
    try:
        sm = _smaps_entry(h.ptr)
        got = backing_name(h)
        rec = RunRecord(alloc_outcome(req.backing, got), actual_backing=got)
        rec.mapped_size = int(h.mapped_size)
        rec.handle_after_alloc = handle_record(h)
        rec.bound_node = _bound_node(h.ptr) if external else h.numa_node
        rec.page_size = sm.get("KernelPageSize", 0) * 1024 or None
        rec.rss = _resident(h.ptr, h.mapped_size)
        rec.pages_on = {k: v for k, v in _pages_on(h.ptr).items() if v}
        return rec
    finally:
        report("free")
        allocator.free(h)


def measure_builtin(req: AllocRequest, profile: str) -> RunRecord:
    """``req`` on umbp-sim's allocator with ``profile`` on the real kernel, in this process."""
    import umbp_sim._native as _native
    from umbp_sim.allocator import UMBPHostBufferBacking, UMBPHostMemAllocator
    from umbp_sim.engine.execute import ALLOCATOR_LOGGER

    allocator = UMBPHostMemAllocator(kernel=_native.LinuxKernel(), profile=profile)
    with capture_logs((ALLOCATOR_LOGGER,)) as logs:
        rec = measure(req, allocator, UMBPHostBufferBacking, False)
    rec.warnings = list(logs.messages)
    rec.allocator_warnings = logs.of(ALLOCATOR_LOGGER)
    return rec


_FIELDS = (
    "outcome", "failure", "error", "actual_backing", "bound_node", "page_size", "rss",
    "mapped_size", "handle_after_alloc", "warnings", "allocator_warnings",
)  # fmt: skip


def measure_in_child(run: Run, timeout: float = MEASURE_TIMEOUT) -> RunRecord:
    """A built-in profile's ``Measure`` run in a child process of its own."""
    assert isinstance(run.work, Measure)
    # Here, not with the module: an allocator's server loads this module, and each module it
    # holds makes every fork of it dearer; a built-in profile's Measure runs in its owner.
    import subprocess

    spec = {"request": run.work.request.table(), "allocator": run.allocator}
    try:
        proc = subprocess.run(
            module_argv("umbp_sim.engine.measure", json.dumps(spec)),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise UmbpSimError(f"the real allocation's process took over {timeout:.0f} s") from None
    if proc.returncode < 0:
        sig = signal.Signals(-proc.returncode).name
        return RunRecord("crashed", signal=sig, simulated=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UmbpSimError(f"the real allocation's process exited {proc.returncode}: {last}")
    doc = json.loads(proc.stdout)
    rec = RunRecord(**{k: doc[k] for k in _FIELDS})
    rec.pages_on = {int(k): v for k, v in doc["pages_on"].items()}
    return rec


def main() -> None:
    spec = json.loads(sys.argv[1])
    rec = measure_builtin(AllocRequest.from_table(spec["request"]), spec["allocator"])
    doc: dict[str, Any] = {k: getattr(rec, k) for k in _FIELDS}
    doc["pages_on"] = {str(k): v for k, v in rec.pages_on.items()}
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
