"""Run a scenario on a simulated host and compare what happened with what it expects.

The stack for one scenario::

    allocator -> TracingKernel -> FaultyKernel (the [[faults]]) -> SimKernel (the [machine])

Outcomes: ``crashed`` (a simulated SIGBUS/SIGKILL), ``failed`` (a null handle or the caller's
error), ``demoted`` (hugepages asked for, 4 KiB pages given), ``ok``. Counters named in
``[expect].counters`` are read after the request and before cleanup; leaks are looked for after
cleanup (a crashed host is dead, so leaks are not counted there).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from umbp_sim import _context
from umbp_sim.allocator import UMBPHostMemAllocator
from umbp_sim.backing import alloc_outcome, is_demoted
from umbp_sim.errors import SimulatedCrash, UmbpSimError
from umbp_sim.faults import FaultPlan
from umbp_sim.leaks import collect_leaks
from umbp_sim.log_capture import capture_logs
from umbp_sim.machine import HugePool, Machine
from umbp_sim.mori_compat import mori_module
from umbp_sim.profiles import FIELD_PROFILE, canonical_profile
from umbp_sim.request import AllocRequest
from umbp_sim.scenario.schema import Scenario, ScenarioError
from umbp_sim.sim import SimHost, simulate
from umbp_sim.trace import instrument, trace_text
from umbp_sim.units import parse_size

WARNING_LOGGERS = ("umbp_sim", "sglang")
ALLOCATOR_LOGGER = "umbp_sim.allocator"
_COUNTER_RE = re.compile(
    r"^(?:node(?P<node>\d+)\.)?hugepages\.(?P<size>[0-9A-Za-z]+)\.(?P<field>total|free|reserved|surplus)$"
)


@dataclass
class Observed:
    outcome: str
    actual_backing: str | None = None
    mapped_size: int | None = None
    bound_node: int | None = None  # the node mbind bound the (last) buffer to, -1 if none
    error: str | None = None
    signal: str | None = None
    crash_node: int | None = None
    warnings: list[str] = field(default_factory=list)
    # The allocator's own lines among the warnings (what mori's log would carry).
    allocator_warnings: list[str] = field(default_factory=list)
    # Every warning with the logger that said it (sglang's own lines are under "sglang.").
    log: list[tuple[str, str]] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    steps: list[str] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)
    trace: str = ""
    # SimKernel's recorded reasons (umbp_sim.sim.Reason), and what sglang's host check read.
    reasons: list[Any] = field(default_factory=list)
    budget: dict[str, int] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "actual_backing": self.actual_backing,
            "mapped_size": self.mapped_size,
            "error": self.error,
            "signal": self.signal,
            "crash_node": self.crash_node,
            "warnings": self.warnings,
            "counters": self.counters,
            "steps": self.steps,
            "leaks": self.leaks,
        }


@dataclass
class ScenarioResult:
    scenario: Scenario
    observed: Observed
    mismatches: list[str]

    @property
    def passed(self) -> bool:
        return not self.mismatches

    def report(self) -> str:
        """What differed, then the syscall trace: the failure report of a scenario."""
        lines = [f"{self.scenario.path}: {self.scenario.name}"]
        lines += [f"  {m}" for m in self.mismatches]
        if self.observed.warnings:
            lines.append("  warnings:")
            lines += [f"    {w}" for w in self.observed.warnings]
        if self.observed.trace:
            lines.append("  syscall trace:")
            lines += [f"    {t}" for t in self.observed.trace.splitlines()]
        return "\n".join(lines)


# ---- building the host ----------------------------------------------------------------------
def build_machine(scn: Scenario) -> Machine:
    """The Machine of a scenario's [machine] table: a dump plus overrides, or built inline."""
    table = dict(scn.machine)
    try:
        free_per_node = table.pop("free_hugepages_per_node", None)
        if "dump" in table:
            dump = table.pop("dump")
            for key in ("nodes", "mem_per_node", "hugepages", "hugepages_per_node"):
                if key in table:
                    raise ScenarioError(
                        f"{scn.path}: [machine].{key}: cannot be combined with dump (the dump "
                        "gives the nodes and pools; override Machine fields instead)"
                    )
            from umbp_sim.dump import load_dump, open_dump

            # no symbolic link as the dump, no bare meminfo: see schema._dump_path
            src = open_dump(dump, follow_symlinks=False, bare=False)
            try:
                machine = load_dump(src)[0].apply(**table)
            finally:
                src.close()
        else:
            machine = Machine.build(**table)  # type: ignore[arg-type]
        if free_per_node is not None:
            _set_free_pages(scn, machine, free_per_node)
        return machine.validate()
    except ScenarioError:
        raise
    except (ValueError, TypeError) as e:
        raise ScenarioError(f"{scn.path}: [machine]: {e}") from None


def _set_free_pages(scn: Scenario, machine: Machine, per_node: Any) -> None:
    if not isinstance(per_node, list) or len(per_node) != len(machine.nodes):
        raise ScenarioError(
            f"{scn.path}: [machine].free_hugepages_per_node: needs one table per node "
            f"({len(machine.nodes)})"
        )
    for node, table in zip(machine.nodes, per_node, strict=True):
        for size, free in table.items():
            s = parse_size(size, "free_hugepages_per_node")
            pool = node.hugepages.setdefault(s, HugePool())
            pool.free = free


# ---- running ---------------------------------------------------------------------------------
def _null_handle_error(size: int, backing: str, node: int) -> str:
    # What sglang's wrapper raises for a null handle: the text on-call engineers search for.
    return (
        f"RuntimeError: UMBPHostMemAllocator.alloc({size} bytes) failed "
        f"(requested_backing=UMBPHostBufferBacking.{backing}, numa_node={node})."
    )


def _alloc_args(table: dict[str, Any]) -> tuple[int, str, int, int, bool]:
    # (external/matrix.py and external/observe.py read a table through this)
    return AllocRequest.from_table(table).fields()


def _backing_name(handle: Any) -> str:
    return str(handle.actual_backing).rsplit(".", 1)[-1]


def _run_alloc(scn: Scenario, allocator: UMBPHostMemAllocator, host: SimHost, obs: Observed) -> Any:
    req = AllocRequest.from_table(scn.request)
    handle = allocator.alloc(*req.args())
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
            h = allocator.alloc(*req.args())
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
            obs.bound_node = h.numa_node
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
    """The HiCache host-pool request of an ``[request]`` table with ``kind = "sglang"`` (the
    model: MLA when ``kv_lora_rank`` is given, else MHA with ``kv_heads`` split by ``tp_size``).
    Raises KeyError, ValueError or TypeError on a bad table."""
    from umbp_sim.sglang import MHAModel, MLAModel, hicache_request

    dtype = r.get("dtype", "bfloat16")
    if "kv_lora_rank" in r:
        model: Any = MLAModel(r["layers"], r["kv_lora_rank"], r.get("qk_rope_head_dim", 64),
                              dtype, r.get("index_head_dim"))  # fmt: skip
    else:
        kv_heads = r["kv_heads"]
        if "tp_size" in r:
            kv_heads = max(1, kv_heads // r["tp_size"])
        model = MHAModel(r["layers"], kv_heads, r["head_dim"], dtype)
    return hicache_request(
        model,
        layout=r.get("layout", "layer_first"),
        page_size=r.get("page_size", 1),
        hicache_size=r.get("hicache_size", 0),
        hicache_ratio=r.get("hicache_ratio", 2.0),
        device_pool_tokens=r.get("device_pool_tokens"),
    )


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
    obs.signal = result.signal
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


def _counter(host: SimHost, key: str) -> int:
    if key.startswith("meminfo."):
        name = key.removeprefix("meminfo.")
        info = host.meminfo()
        if name not in info:
            raise KeyError(key)
        return info[name]
    m = _COUNTER_RE.match(key)
    if not m:
        raise KeyError(key)
    if m.group("node") is not None and m.group("field") == "reserved":
        raise KeyError(key)  # the kernel keeps no per-node Rsvd (kernel-model.md 0)
    size = parse_size(m.group("size"), key)
    pages = (
        host.node_hugepages(int(m.group("node")), size)
        if m.group("node") is not None
        else host.hugepages(size)
    )
    return int(getattr(pages, m.group("field")))


def scenario_profile(scn: Scenario, profile: str | None = None) -> str:
    """The allocator profile a scenario runs with: its own, else ``profile``, else the field's."""
    return canonical_profile(scn.allocator or profile or FIELD_PROFILE)


def run_scenario(scn: Scenario, profile: str | None = None) -> ScenarioResult:
    """Run ``scn``; a scenario naming no allocator runs with ``profile`` (default: the field's)."""
    machine = build_machine(scn)
    obs = observe(scn, machine, profile=profile)
    return ScenarioResult(scn, obs, compare(scn.expect, obs))


def observe(
    scn: Scenario,
    machine: Machine,
    setup: Callable[[SimHost], None] | None = None,
    profile: str | None = None,
) -> Observed:
    """Run ``scn``'s request on a SimKernel built from ``machine``; ``setup`` runs first.

    ``setup`` applies admin writes (``host.set_nr_hugepages``) to the fresh host before the
    request: the replay tool re-runs a request with a proposed fix this way. The allocator
    follows :func:`scenario_profile`.
    """
    profile = scenario_profile(scn, profile)
    try:
        plan = FaultPlan.from_rules(scn.faults, scn.fault_seed) if scn.faults else None
    except (UmbpSimError, ValueError) as e:
        raise ScenarioError(f"{scn.path}: {e}") from None
    obs = Observed(outcome="ok")
    wanted = list(scn.expect.get("counters", {}))
    with simulate(machine) as host, capture_logs(WARNING_LOGGERS) as warnings:
        if setup is not None:
            setup(host)
        stack = instrument(host.kernel, plan)
        _context.push_kernel(stack.kernel)
        allocator = None
        handle = None
        startup = None
        try:
            if scn.request_kind == "sglang":
                startup = _run_sglang(scn, host, obs, profile)
            else:
                allocator = UMBPHostMemAllocator(kernel=stack.kernel, profile=profile)
                if scn.request_kind == "alloc":
                    handle = _run_alloc(scn, allocator, host, obs)
                else:
                    _run_steps(scn, allocator, host, obs)
        except SimulatedCrash as e:
            obs.outcome, obs.signal, obs.crash_node = "crashed", e.signal, e.node
            obs.error = str(e)
        finally:
            _context.pop_kernel(stack.kernel)
        for key in wanted:
            try:
                obs.counters[key] = _counter(host, key)
            except KeyError:
                raise ScenarioError(
                    f"{scn.path}: [expect].counters.{key}: no such counter (use "
                    "hugepages.<size>.<total|free|reserved|surplus>, "
                    "node<N>.hugepages.<size>.<total|free|surplus> or meminfo.<Field>)"
                ) from None
            except (UmbpSimError, ValueError) as e:  # a size or node this host does not have
                raise ScenarioError(f"{scn.path}: [expect].counters.{key}: {e}") from None
        if obs.outcome != "crashed":
            if handle is not None and allocator is not None:
                allocator.free(handle)
            if startup is not None:
                startup.close()
            obs.leaks = collect_leaks(*(s for s in (host, allocator, stack.kernel) if s))
        obs.trace = trace_text(stack.kernel, last=40)
        obs.reasons = host.reasons()
    obs.warnings = list(warnings.messages)
    obs.allocator_warnings = warnings.of(ALLOCATOR_LOGGER)
    obs.log = list(warnings.log)
    return obs


# ---- comparing ---------------------------------------------------------------------------------
def compare(expect: dict[str, Any], obs: Observed) -> list[str]:
    """Each way the observation differs from the expectation, one line each."""
    out: list[str] = []

    def differ(what: str, want: Any, got: Any) -> None:
        if want != got:
            out.append(f"{what}: expected {want!r}, got {got!r}")

    differ("outcome", expect["outcome"], obs.outcome)
    if "actual_backing" in expect:
        differ("actual_backing", expect["actual_backing"], obs.actual_backing)
    if "mapped_size" in expect:
        differ("mapped_size", parse_size(expect["mapped_size"], "mapped_size"), obs.mapped_size)
    if "error" in expect:
        differ("error", expect["error"], obs.error)
    if "error_regex" in expect and not re.search(expect["error_regex"], obs.error or ""):
        out.append(f"error: {obs.error!r} does not match /{expect['error_regex']}/")
    if "signal" in expect:
        differ("signal", expect["signal"], obs.signal)
    if "crash_node" in expect:
        differ("crash_node", expect["crash_node"], obs.crash_node)
    for want in expect.get("warnings", []):
        if not any(want in w for w in obs.warnings):
            out.append(f"warnings: none contains {want!r}")
    if expect.get("no_warnings") and obs.warnings:
        out.append(f"warnings: expected none, got {obs.warnings!r}")
    for key, want in expect.get("counters", {}).items():
        differ(f"counters.{key}", want, obs.counters.get(key))
    if "steps" in expect:
        differ("steps", expect["steps"], obs.steps)
    if expect.get("no_leaks") and obs.leaks:
        out.append(f"leaks: {'; '.join(obs.leaks)}")
    return out
