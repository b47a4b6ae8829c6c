"""Running a scenario's ``[request]`` on an allocator: one ``alloc``, a list of ``steps``, or an
sglang HiCache host pool (and what sglang's host check read). ``umbp_sim.scenario.runner``
calls these and re-exports the public ones."""

from __future__ import annotations

from typing import Any

from umbp_sim.allocator import UMBPHostMemAllocator
from umbp_sim.backing import alloc_outcome, is_demoted
from umbp_sim.mori_compat import mori_module
from umbp_sim.request import AllocRequest
from umbp_sim.scenario.observed import Observed
from umbp_sim.scenario.schema import Scenario, ScenarioError
from umbp_sim.sim import SimHost
from umbp_sim.units import parse_size


def _null_handle_error(size: int, backing: str, node: int) -> str:
    # What sglang's wrapper raises for a null handle: the text on-call engineers search for.
    return (
        f"RuntimeError: UMBPHostMemAllocator.alloc({size} bytes) failed "
        f"(requested_backing=UMBPHostBufferBacking.{backing}, numa_node={node})."
    )


def _backing_name(handle: Any) -> str:
    return str(handle.actual_backing).rsplit(".", 1)[-1]


def raised(e: BaseException) -> str:
    """What a server's log shows for an exception out of the allocator (``MemoryError:
    std::bad_alloc``: mori lets ``std::bad_alloc`` escape ``Alloc``), as the external runner
    writes it."""
    return f"{type(e).__name__}: {e}"


def _run_alloc(scn: Scenario, allocator: UMBPHostMemAllocator, host: SimHost, obs: Observed) -> Any:
    req = AllocRequest.from_table(scn.request)
    try:
        handle = allocator.alloc(*req.args())
    except MemoryError as e:  # the allocator's exception is the outcome: the server dies of it
        obs.outcome, obs.error = "failed", raised(e)
        return None
    if not handle:
        obs.outcome = "failed"
        obs.error = _null_handle_error(req.size, req.backing, req.numa_node)
        return None
    obs.actual_backing = _backing_name(handle)
    obs.mapped_size = handle.mapped_size
    obs.bound_node = handle.numa_node
    obs.outcome = alloc_outcome(req.backing, obs.actual_backing)
    return handle


def _run_steps(
    scn: Scenario, allocator: UMBPHostMemAllocator, host: SimHost, obs: Observed
) -> None:
    handles: dict[str, Any] = {}
    # Base address of each alloc: Free clears the handle, but a later acquire/lookup/release
    # of the same buffer must still name its address (that is what a registration holds).
    bases: dict[str, int] = {}
    obs.outcome = "ok"
    for i, step in enumerate(scn.request["steps"]):
        op = step["op"]
        if op == "alloc":
            req = AllocRequest.from_table(step)
            try:
                h = allocator.alloc(*req.args())
            except MemoryError as e:  # escaped the allocator: the process stops here
                obs.steps.append(f"alloc raised {type(e).__name__}")
                obs.outcome, obs.error = "failed", raised(e)
                return
            handles[step["id"]] = h
            bases[step["id"]] = h.ptr if h else 0
            if not h:
                obs.steps.append("alloc failed")
                obs.outcome = "failed"
                obs.error = _null_handle_error(req.size, req.backing, req.numa_node)
                continue
            got = _backing_name(h)
            demoted = is_demoted(req.backing, got)
            if demoted and obs.outcome == "ok":
                obs.outcome = "demoted"
            obs.actual_backing, obs.mapped_size = got, h.mapped_size
            obs.bound_node = getattr(h, "numa_node", None)  # mori's handle has none
            obs.steps.append(f"alloc {'demoted' if demoted else 'ok'} {got} {h.mapped_size}")
            continue
        if op == "set_nr_hugepages":
            hp = parse_size(step.get("hugepage_size", 2 << 20), "hugepage_size")
            host.set_nr_hugepages(hp, step["pages"], step.get("node"))
            obs.steps.append(f"nr_hugepages {host.hugepages(hp).total}")
            continue
        if step["id"] not in handles:
            raise ScenarioError(
                f"{scn.path}: [request].steps[{i}].id: {step['id']!r} names no earlier alloc"
            )
        h = handles[step["id"]]
        base = bases[step["id"]]
        ptr = base + parse_size(step.get("offset", 0), "offset") if base else 0
        if op == "free":
            allocator.free(h)
            obs.steps.append("freed")
        elif op in ("acquire", "lookup"):
            size = parse_size(step.get("size", 1), "size")
            fn = (
                allocator.acquire_shm_allocation
                if op == "acquire"
                else (allocator.lookup_shm_allocation)
            )
            found = fn(ptr, size)
            obs.steps.append(f"{op} {'found' if found is not None else 'none'}")
        elif op == "release":
            allocator.release_shm_allocation(base)
            obs.steps.append("released")


def sglang_request_of(r: dict[str, Any]) -> Any:
    """The HiCache host-pool request of an ``[request]`` table with ``kind = "sglang"``
    (``umbp_sim.sglang.sizing.hicache_request_of_table``). Raises KeyError, ValueError or
    TypeError on a bad table."""
    from umbp_sim.sglang.sizing import hicache_request_of_table

    return hicache_request_of_table(r)


def _run_sglang(scn: Scenario, host: SimHost, obs: Observed, profile: str) -> Any:
    """Start the host pool; returns the startup, whose buffers the caller frees after counters."""
    from umbp_sim.sglang import start_host_pool
    from umbp_sim.sglang.sizing import parse_meminfo

    try:
        request = sglang_request_of(scn.request)
    except (KeyError, ValueError, TypeError) as e:
        raise ScenarioError(f"{scn.path}: [request]: {e}") from None
    meminfo = parse_meminfo(host.read("/proc/meminfo"), "/proc/meminfo")
    result = start_host_pool(
        request,
        meminfo,
        env=scn.env,
        module=mori_module(profile),
        keep=True,
        release=scn.sglang,
        watermark_low_pages=zoneinfo_low_pages(host),
    )
    obs.budget = result_budget(meminfo, host)
    obs.outcome = "ok" if result.outcome == "fallback" else result.outcome
    obs.error = result.error
    obs.signal, obs.crash_node = result.signal, result.crash_node
    if result.handles:
        last = result.handles[-1]
        obs.actual_backing = _backing_name(last)
        obs.mapped_size = last.mapped_size
        obs.bound_node = getattr(last, "numa_node", None)
    return result


def zoneinfo_low_pages(host: SimHost) -> int:
    """Σ "low" of the simulated /proc/zoneinfo in 4 KiB pages (sglang's page-size assumption):
    psutil's input when /proc/meminfo has no MemAvailable."""
    pages = sum(
        int(parts[1])
        for parts in (line.split() for line in host.read("/proc/zoneinfo").splitlines())
        if len(parts) == 2 and parts[0] == "low"
    )
    return pages * host.machine.page_size // 4096


def result_budget(meminfo: dict[str, int], host: SimHost) -> dict[str, int]:
    """What sglang's host check read: available bytes (psutil's number) and how it got it."""
    from umbp_sim.sglang.sizing import host_available_bytes

    low = zoneinfo_low_pages(host)
    avail = host_available_bytes(meminfo, watermark_low_pages=low, page_size=4096)
    out = {"available": avail, "watermark_low": low * 4096}
    for key in ("MemAvailable", "MemFree", "Cached", "Active(file)", "Inactive(file)",
                "SReclaimable"):  # fmt: skip
        if key in meminfo:
            out[key] = meminfo[key] * 1024
    return out
