"""The three kinds of simulated work, each filling a ``RunRecord``: one ``alloc``, a scenario's
``steps``, sglang's host-pool startup. ``umbp_sim.engine.execute`` calls them with the
allocator under test (``Subject``) and the fresh host; what they leave held goes in ``Held``,
which the run frees after the counters are read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from umbp_sim.engine.binding import binding, faulted, mapping, pools_free
from umbp_sim.engine.record import RunRecord, handle_fields, handle_record
from umbp_sim.engine.spec import Alloc, RunError, SglangStartup, Steps
from umbp_sim.engine.subject import Subject
from umbp_sim.request import AllocRequest
from umbp_sim.sglang.sizing import (
    HICACHE_HOST_MEMORY_RESERVE_BYTES,
    hicache_request_of_table,
    host_available_bytes,
    host_memory_error,
    parse_meminfo,
)
from umbp_sim.sim import SimHost
from umbp_sim.vocabulary.backing import alloc_outcome, is_demoted
from umbp_sim.vocabulary.units import parse_size


def null_handle_error(size: int, backing: str, node: int) -> str:
    # What sglang's wrapper raises for a null handle: the text on-call engineers search for.
    return (
        f"RuntimeError: UMBPHostMemAllocator.alloc({size} bytes) failed "
        f"(requested_backing=UMBPHostBufferBacking.{backing}, numa_node={node})."
    )


def raised(e: BaseException) -> str:
    """What a server's log shows for an exception out of the allocator (``MemoryError:
    std::bad_alloc``: mori lets ``std::bad_alloc`` escape ``Alloc``)."""
    return f"{type(e).__name__}: {e}"


def backing_name(handle: Any) -> str:
    return str(getattr(handle.actual_backing, "name", handle.actual_backing)).rsplit(".", 1)[-1]


@dataclass
class Held:
    """What the work leaves to free at the end: an allocator's buffers, or sglang's startup."""

    allocator: Any = None
    handles: list[Any] = field(default_factory=list)
    startups: list[Any] = field(default_factory=list)  # sglang's startups, one per rank
    stage: str = "alloc"  # where the process is (a crash's stage)
    # An Alloc's buffer as the shm registry is asked of it: ptr, mapped size, record_fds.
    probe: tuple[int, int, tuple[int, ...] | None] | None = None


def _failed(
    rec: RunRecord, failure: str, error: str, null_alloc: AllocRequest | None = None
) -> None:
    """``rec`` failed with ``error``; ``null_alloc``: the call whose null handle it is."""
    rec.outcome, rec.failure, rec.error, rec.null_alloc = "failed", failure, error, null_alloc


def _null_handle(rec: RunRecord, req: AllocRequest) -> None:
    """``req`` returned a null handle: sglang's wrapper raises its line."""
    _failed(rec, "invalid", null_handle_error(req.size, req.backing, req.numa_node), req)


def run_alloc(work: Alloc, subject: Subject, host: SimHost, rec: RunRecord, held: Held) -> None:
    if work.ranks > 1 or work.dram_tier is not None:
        run_ranks(work, subject, host, rec, held)
        return
    req = work.request
    kernel = host.kernel
    if work.host_check and not passes_host_check(req.size, host, rec):
        return
    before = pools_free(kernel, host.machine)
    subject.stage("alloc", size=req.size)
    held.allocator = allocator = subject.allocator()
    try:
        h = allocator.alloc(req)
    except subject.harness_errors:
        raise
    except Exception as e:  # noqa: BLE001 - the allocator's exception is the outcome
        _failed(rec, "raised", raised(e))
        return
    held.handles.append(h)
    rec.handle = handle_fields(h)
    rec.handle_after_alloc = handle_record(h)
    if not h:
        _null_handle(rec, req)
        return
    rec.faulted = faulted(kernel, int(h.ptr), int(h.mapped_size))  # before the user's write
    if work.write:
        held.stage = "write"
        subject.stage("write")
        subject.write_first_byte(int(h.ptr))
    rec.actual_backing = backing_name(h)
    rec.mapped_size = int(h.mapped_size)
    rec.bound_node = subject.bound_node(host, h)
    rec.binding = binding(kernel, host.machine, int(h.ptr), before)
    rec.mapping = mapping(kernel, int(h.ptr))
    rec.outcome = alloc_outcome(req.backing, rec.actual_backing)
    if subject.registry:
        held.stage = "lookup"  # a crash in the registry's lookup is its own, not the write's
        subject.stage("lookup")
        ptr = int(h.ptr)
        held.probe = (ptr, int(h.mapped_size), record_fds(host, ptr))
        rec.registry = registry_probe(subject, allocator, held.probe)


def run_ranks(work: Alloc, subject: Subject, host: SimHost, rec: RunRecord, held: Held) -> None:
    """``work.ranks`` ranks each allocating ``work.request`` on one host, in the order they
    start (sglang's check first, when asked), every buffer kept: the record is the worst rank's
    (its error, backing, node, the budget its check read), ``rec.ranks`` each rank's. A rank
    killed by a simulated signal ends the run there (SimulatedCrash): the ranks after it are
    not simulated."""
    req = work.request
    subject.stage("alloc", size=req.size)
    held.allocator = allocator = subject.allocator()
    worst: RunRecord | None = None
    for rank in range(work.ranks):
        one = RunRecord(outcome="ok")
        if not work.host_check or passes_host_check(req.size, host, one):
            try:
                h = allocator.alloc(req)
            except subject.harness_errors:
                raise
            except Exception as e:  # noqa: BLE001 - the allocator's exception is the outcome
                _failed(one, "raised", raised(e))
            else:
                held.handles.append(h)
                if not h:
                    _null_handle(one, req)
                else:
                    one.actual_backing = backing_name(h)
                    one.mapped_size = int(h.mapped_size)
                    one.bound_node = subject.bound_node(host, h)
                    one.outcome = alloc_outcome(req.backing, one.actual_backing)
        entry = _rank_entry(rank, one.outcome, one.error, one.actual_backing)
        if work.dram_tier is not None and one.outcome in ("ok", "demoted"):
            entry["dram_tier"] = dram_tier_alloc(work.dram_tier, subject, allocator, held, one)
            entry.update(outcome=one.outcome, error=one.error)
            if one.outcome == "failed":
                one.actual_backing = one.mapped_size = one.bound_node = None
        rec.ranks.append(entry)
        if worst is None or WORST_FIRST[one.outcome] < WORST_FIRST[worst.outcome]:
            worst = one
    assert worst is not None
    rec.outcome, rec.failure, rec.error = worst.outcome, worst.failure, worst.error
    rec.null_alloc = worst.null_alloc
    rec.actual_backing, rec.mapped_size = worst.actual_backing, worst.mapped_size
    rec.bound_node, rec.budget = worst.bound_node, worst.budget


def dram_tier_failed(size: int) -> str:
    # What mori's UMBP store logs when its DRAM tier's buffer is not allocated; the server stops.
    return f"DRAMTier: memory allocation failed for {size} bytes"


def dram_tier_alloc(
    req: AllocRequest, subject: Subject, allocator: Any, held: Held, rank: RunRecord
) -> str:
    """mori's DRAM tier in a rank's process, after its pool: its backing (or "failed"); a
    failure is the rank's outcome (the store throws and the server stops)."""
    try:
        h = allocator.alloc(req)
    except subject.harness_errors:
        raise
    except Exception as e:  # noqa: BLE001 - the allocator's exception is the outcome
        _failed(rank, "raised", f"{dram_tier_failed(req.size)} ({raised(e)})")
        return "failed"
    held.handles.append(h)
    if not h:
        _failed(rank, "invalid", dram_tier_failed(req.size))
        return "failed"
    got = backing_name(h)
    if alloc_outcome(req.backing, got) == "demoted":  # the rank did not get all it asked
        rank.outcome = "demoted"
    return got


def passes_host_check(nbytes: int, host: SimHost, rec: RunRecord) -> bool:
    """sglang's host check of an ``nbytes`` pool on ``host`` as it stands (its numbers kept in
    ``rec.budget``); a refusal is the run's outcome, sglang's ValueError."""
    meminfo = parse_meminfo(host.read("/proc/meminfo"), "/proc/meminfo")
    rec.budget = result_budget(meminfo, host)
    room = rec.budget["available"] - HICACHE_HOST_MEMORY_RESERVE_BYTES
    if nbytes <= room:
        return True
    _failed(rec, "raised", f"ValueError: {host_memory_error(nbytes, room)}")
    return False


def run_steps(work: Steps, subject: Subject, host: SimHost, rec: RunRecord, held: Held) -> None:
    subject.stage("alloc")
    held.allocator = allocator = subject.allocator()
    handles: dict[str, Any] = {}
    # Base address of each alloc: Free clears the handle, but a later acquire/lookup/release
    # of the same buffer must still name its address (that is what a registration holds).
    bases: dict[str, int] = {}
    fds: dict[str, tuple[int, ...] | None] = {}  # the fds each alloc's record may name
    for i, step in enumerate(work.steps):
        op = step["op"]
        if op == "alloc":
            req = AllocRequest.from_table(step)
            try:
                h = allocator.alloc(req)
            except subject.harness_errors:
                raise
            except Exception as e:  # noqa: BLE001 - escaped the allocator: the process stops
                rec.steps.append(f"alloc raised {type(e).__name__}")
                _failed(rec, "raised", raised(e))
                return
            handles[step["id"]] = h
            bases[step["id"]] = h.ptr if h else 0
            fds[step["id"]] = record_fds(host, h.ptr) if h else None
            if not h:
                rec.steps.append("alloc failed")
                _null_handle(rec, req)
                continue
            got = backing_name(h)
            demoted = is_demoted(req.backing, got)
            if demoted and rec.outcome == "ok":
                rec.outcome = "demoted"
            rec.actual_backing, rec.mapped_size = got, int(h.mapped_size)
            rec.bound_node = subject.bound_node(host, h)
            rec.steps.append(f"alloc {'demoted' if demoted else 'ok'} {got} {h.mapped_size}")
            continue
        if op == "set_nr_hugepages":
            hp = parse_size(step.get("hugepage_size", 2 << 20), "hugepage_size")
            host.set_nr_hugepages(hp, step["pages"], step.get("node"))
            rec.steps.append(f"nr_hugepages {host.hugepages(hp).total}")
            continue
        if step["id"] not in handles:
            raise RunError(f"[request].steps[{i}].id: {step['id']!r} names no earlier alloc")
        h = handles[step["id"]]
        base = bases[step["id"]]
        ptr = base + parse_size(step.get("offset", 0), "offset") if base else 0
        if op == "mapped":  # the host's answer, whatever the allocator's bookkeeping says
            live = base != 0 and host.mapping_at(base) is not None
            rec.steps.append(f"mapped {'yes' if live else 'no'}")
        elif op == "free":
            allocator.free(h)
            rec.steps.append("freed")
        elif op in ("acquire", "lookup"):
            size = parse_size(step.get("size", 1), "size")
            fn = allocator.acquire_shm_allocation if op == "acquire" else (
                allocator.lookup_shm_allocation
            )  # fmt: skip
            found = fn(ptr, size)
            rec.steps.append(f"{op} {registration(found, base, fds[step['id']])}")
        elif op == "release":
            allocator.release_shm_allocation(base)
            rec.steps.append("released")


def record_fds(host: SimHost, base: int) -> tuple[int, ...] | None:
    """The fds a registry record of the buffer at ``base`` may name: those open on the file
    that backs it now (its memfd; the same rule for every build: mori's handle has no fd);
    None for anonymous memory."""
    m = host.mapping_at(base)
    return m.file_fds if m is not None and m.file_size >= 0 else None


def registration(found: Any, base: int, fds: tuple[int, ...] | None) -> str:
    """A registry lookup's answer as a step says it: ``none``, or ``found`` with the record's
    mapped size (``found 4198400``), its base when it is not the alloc's (``at +4096``) and
    ``other fd`` when its fd is none of ``fds`` (``record_fds``). ``found`` has
    UMBPShmAllocation's fields (an external build's, run_job.ShmRecord)."""
    if found is None:
        return "none"
    text = f"found {int(found.mapped_size)}"
    if int(found.base) != base:
        text += f" at {int(found.base) - base:+d}"
    if fds is not None and int(found.fd) not in fds:
        text += " other fd"
    return text


def registry_probe(
    subject: Subject, allocator: Any, probe: tuple[int, int, tuple[int, ...] | None]
) -> str:
    """What the shm registry holds of a buffer: a lookup of its whole mapped range, in
    ``registration``'s words (``found 4198400``, ``none``); an exception out of the lookup is
    said by its type. Every run's buffer is asked, not only a scenario's: a record with the
    requested size, another base or fd, or one Free leaves behind, differs in any run."""
    ptr, size, fd = probe
    try:
        found = allocator.lookup_shm_allocation(ptr, size)
    except subject.harness_errors:
        raise
    except Exception as e:  # noqa: BLE001 - the allocator's answer
        return f"lookup raised {type(e).__name__}"
    return registration(found, ptr, fd)


def sglang_request_of(r: Any) -> Any:
    """The HiCache host-pool request of an ``[request]`` table with ``kind = "sglang"``
    (``umbp_sim.sglang.sizing.hicache_request_of_table``). Raises KeyError, ValueError or
    TypeError on a bad table."""
    return hicache_request_of_table(r)


def start_sglang(
    work: SglangStartup, env: dict[str, str], subject: Subject, host: SimHost, rec: RunRecord,
    held: Held,
) -> None:  # fmt: skip
    """sglang's host-pool startup with the subject's module as ``mori.umbp`` (its calls in the
    subject's scope); the startup is held, its buffers freed after the counters."""
    from umbp_sim.sglang import start_host_pool  # imports torch: only sglang's runs pay it

    try:
        request = sglang_request_of(work.request)
    except (KeyError, ValueError, TypeError) as e:
        raise RunError(f"[request]: {e}") from None
    worst: tuple[str, str | None, Any, dict[str, int]] | None = None
    for rank in range(work.ranks):
        # Each rank's check reads the host the ranks before it left.
        meminfo = parse_meminfo(host.read("/proc/meminfo"), "/proc/meminfo")
        budget = result_budget(meminfo, host)
        subject.stage("alloc", budget=budget)  # what a death leaves: the host check's numbers
        with subject.scope():
            one = start_host_pool(
                request,
                meminfo,
                env=env,
                module=subject.module(),
                keep=True,
                release=work.release,
                watermark_low_pages=zoneinfo_low_pages(host),
            )
        held.startups.append(one)
        outcome, error = _outcome_of(one), one.error
        backing = backing_name(one.handles[-1]) if one.handles else None
        entry = _rank_entry(rank, outcome, error, backing)
        if work.dram_tier is not None and outcome in ("ok", "demoted"):
            tier = RunRecord(outcome=outcome)
            held.allocator = held.allocator or subject.allocator()
            entry["dram_tier"] = dram_tier_alloc(
                work.dram_tier, subject, held.allocator, held, tier
            )
            outcome, error = tier.outcome, tier.error
            entry.update(outcome=outcome, error=error)
        if work.ranks > 1 or work.dram_tier is not None:
            rec.ranks.append(entry)
        if worst is None or WORST_FIRST[outcome] < WORST_FIRST[worst[0]]:
            worst = (outcome, error, one, budget)
        if outcome == "crashed":  # that process is dead; the ranks after it are not simulated
            break
    assert worst is not None
    rec.outcome, rec.error, result, rec.budget = worst
    if rec.outcome == "failed":
        rec.failure = "raised"  # sglang raised (its wrapper's RuntimeError on a null handle)
    rec.signal, rec.crash_node = result.signal, result.crash_node
    if rec.outcome == "crashed":
        rec.stage, rec.simulated = "alloc", True
    if result.handles:
        last = result.handles[-1]
        rec.actual_backing = backing_name(last)
        rec.mapped_size = int(last.mapped_size)
        rec.bound_node = subject.bound_node(host, last)


# Outcomes from worst to best: a run of several ranks is its worst rank's.
WORST_FIRST = {"crashed": 0, "failed": 1, "demoted": 2, "ok": 3}


def _outcome_of(startup: Any) -> str:
    return "ok" if startup.outcome == "fallback" else str(startup.outcome)


def _rank_entry(rank: int, outcome: str, error: str | None, backing: str | None) -> dict[str, Any]:
    return {"rank": rank, "outcome": outcome, "error": error, "actual_backing": backing}


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
    low = zoneinfo_low_pages(host)
    avail = host_available_bytes(meminfo, watermark_low_pages=low, page_size=4096)
    out = {"available": avail, "watermark_low": low * 4096}
    for key in ("MemAvailable", "MemFree", "Cached", "Active(file)", "Inactive(file)",
                "SReclaimable"):  # fmt: skip
        if key in meminfo:
            out[key] = meminfo[key] * 1024
    return out
