"""The stateful exploration: the allocator on a simulated host against the reference model.

``AllocatorStateMachine`` is a Hypothesis ``RuleBasedStateMachine``. Rules: alloc (any backing,
size, hugepage size, node, prefault), free, double free, shm acquire / lookup / release, and
the administrator writing nr_hugepages. ``AllocatorModel`` predicts every result; after every
step the invariants compare the SimKernel's counters (global and per node), the rendered
/proc/meminfo, the live mappings and the open fds with the model. Teardown frees everything
and asserts nothing leaks.

A failure (a disagreement, or a broken invariant) is written as a scenario when
UMBP_SIM_SAVE_FAILURES is set (see ``schedule_to_scenario``). Subclasses can set
``fault_plan`` (a deliberately broken kernel for tests of that path) and ``save_name``.
"""

from __future__ import annotations

import atexit
import copy
import dataclasses
import functools
from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import event, strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from umbp_sim.allocator import UMBPHostMemAllocator
from umbp_sim.errors import SimulatedCrash
from umbp_sim.explore.model import SHM, AllocatorModel
from umbp_sim.explore.schedule_to_scenario import (
    UnwritableMachine,
    save_dir,
    slug,
    write_scenario,
)
from umbp_sim.faults import FaultPlan
from umbp_sim.host.leaks import collect_leaks
from umbp_sim.host.trace import instrument
from umbp_sim.machine import GiB, Machine
from umbp_sim.progress import Progress
from umbp_sim.sim import SimHost
from umbp_sim.strategies import AllocRequest, alloc_requests, machines
from umbp_sim.vocabulary.units import format_size, size_key

F = TypeVar("F", bound=Callable[..., Any])

# Hosts where the model's "memory is plentiful" holds: 64 GiB nodes, small pools, no limits.
MODEL_MACHINES = machines(mem_per_node=64 * GiB, rlimit_as=None, memcg_max=None, max_pool_pages=4)


def _saving(fn: F) -> F:
    """Run a rule or invariant; on failure write the schedule so far as a scenario."""

    @functools.wraps(fn)
    def wrapper(self: AllocatorStateMachine, *args: Any, **kw: Any) -> Any:
        try:
            return fn(self, *args, **kw)
        except Exception as e:
            self.save_failure(e)
            raise

    return wrapper  # type: ignore[return-value]


_PROGRESS: list[Progress] = []


def _explored() -> Progress:
    """The exploration's progress line (on a terminal only: see umbp_sim.progress)."""
    if not _PROGRESS:
        _PROGRESS.append(Progress("explore:"))
        atexit.register(_PROGRESS[0].close)
    return _PROGRESS[0]


class AllocatorStateMachine(RuleBasedStateMachine):
    fault_plan: FaultPlan | None = None
    save_name = "stateful-allocator"
    steps_run = 0  # across instances: the benchmark's counter

    buffers = Bundle("buffers")

    def __init__(self) -> None:
        super().__init__()
        self.machine: Machine | None = None
        self.steps: list[dict[str, Any]] = []
        self.expected_steps: list[str] = []
        self.expected_outcome = "ok"
        self.handles: dict[str, Any] = {}
        self.bases: dict[str, int] = {}  # kept after free, as scenario steps keep them
        self.mapped: dict[str, int] = {}
        self.next_id = 0
        self.saved = False  # only the first failure of a run is the schedule's failure

    # ---- set-up --------------------------------------------------------------------------
    @initialize(machine=MODEL_MACHINES)
    def setup(self, machine: Machine) -> None:
        self.machine = machine
        self.host = SimHost(machine)
        self.stack = instrument(self.host.kernel, self.fault_plan)
        self.allocator = UMBPHostMemAllocator(kernel=self.stack.kernel)
        self.model = AllocatorModel(machine)
        self.sizes = sorted(machine.hugepage_sizes)

    def _alive(self) -> bool:
        return self.machine is not None and not self.model.dead

    def _record(self, step: dict[str, Any], expected: str | None) -> None:
        type(self).steps_run += 1
        self.steps.append(step)
        if expected is not None:
            self.expected_steps.append(expected)

    # ---- rules ---------------------------------------------------------------------------
    @precondition(lambda self: self._alive())
    @rule(target=buffers, data=st.data())
    @_saving
    def alloc(self, data: st.DataObject) -> str:
        assert self.machine is not None
        req: AllocRequest = data.draw(
            alloc_requests(self.machine.hugepage_sizes, nodes=len(self.machine.nodes)),
            label="request",
        )
        key = f"b{self.next_id}"
        self.next_id += 1
        pred = self.model.alloc(key, req.size, req.backing, req.hugepage_size,
                                req.numa_node, req.prefault)  # fmt: skip
        event(f"alloc {req.backing} -> {pred.outcome} {pred.backing or ''}")
        step = {"op": "alloc", "id": key, **req.table()}
        try:
            handle = self.allocator.alloc(*req.args())
        except SimulatedCrash as e:
            self._record(step, None)
            self.expected_outcome = "crashed"
            assert pred.outcome == "crashed", f"alloc {req}: crashed ({e}), model: {pred}"
            assert e.node == pred.crash_node, f"crash on node {e.node}, model: {pred.crash_node}"
            # The process died inside alloc: the mapping it was prefaulting stays (no handle).
            known = {self.bases[k] for k in self.model.buffers if k != key}
            fresh = [m.start for m in self.host.mappings() if m.start not in known]
            self.bases[key] = fresh[0] if len(fresh) == 1 else 0
            self.model.set_base(key, self.bases[key])
            return key
        self.handles[key] = handle
        self.bases[key] = handle.ptr if handle else 0
        self.mapped[key] = handle.mapped_size if handle else 0
        self.model.set_base(key, self.bases[key])
        if pred.outcome == "failed":
            expected = "alloc failed"
            self.expected_outcome = "failed"
        else:
            expected = f"alloc {pred.outcome} {pred.backing} {pred.mapped_size}"
            if pred.outcome == "demoted" and self.expected_outcome == "ok":
                self.expected_outcome = "demoted"
        self._record(step, expected)
        if not handle:
            assert pred.outcome == "failed", f"alloc {req}: invalid handle, model: {pred}"
            return key
        got = str(handle.actual_backing).rsplit(".", 1)[-1]
        assert (pred.backing, pred.mapped_size) == (got, handle.mapped_size), (
            f"alloc {req}: got {got} {handle.mapped_size}, model: {pred}"
        )
        assert handle.requested_size == req.size
        assert handle.ptr % handle.actual_alignment == 0
        return key

    @precondition(lambda self: self._alive())
    @rule(key=buffers)
    @_saving
    def free(self, key: str) -> None:
        self._free(key)

    @precondition(lambda self: self._alive())
    @rule(key=buffers)
    @_saving
    def double_free(self, key: str) -> None:
        self._free(key)
        self._free(key)

    def _free(self, key: str) -> None:
        event(f"free -> {self.model.free(key)}")
        self._record({"op": "free", "id": key}, "freed")
        handle = self.handles.get(key)
        if handle is None:
            return
        self.allocator.free(handle)
        assert not handle and handle.ptr == 0 and handle.mapped_size == 0, (
            f"free({key}): handle still valid: {handle!r}"
        )

    def _ptr(self, key: str, offset: int) -> int:
        # As the scenario runner does: the alloc's base address, also after the free.
        base = self.bases.get(key, 0)
        return base + offset if base else 0

    @precondition(lambda self: self._alive())
    @rule(key=buffers, data=st.data(), acquire=st.booleans())
    @_saving
    def acquire_or_lookup(self, key: str, data: st.DataObject, acquire: bool) -> None:
        mapped = self.mapped.get(key, 0)
        offset = data.draw(st.integers(0, max(0, mapped - 1)), label="offset")
        size = data.draw(st.one_of(st.integers(1, 4096), st.integers(0, mapped + 1)), label="size")
        op = "acquire" if acquire else "lookup"
        ptr = self._ptr(key, offset)
        want = (self.model.acquire if acquire else self.model.lookup)(ptr, size)
        self._record({"op": op, "id": key, "offset": offset, "size": size},
                     f"{op} {'found' if want else 'none'}")  # fmt: skip
        fn = self.allocator.acquire_shm_allocation if acquire else (
            self.allocator.lookup_shm_allocation)  # fmt: skip
        found = fn(ptr, size)
        assert (found is not None) == want, f"{op}({key}, +{offset}, {size}): {found}, model {want}"

    @precondition(lambda self: self._alive())
    @rule(key=buffers)
    @_saving
    def release(self, key: str) -> None:
        self._release(key)

    def _release(self, key: str) -> None:
        # A caller releases the base it acquired, also after freeing its handle.
        base = self._ptr(key, 0)
        event(f"release -> {self.model.release(base)}")
        self._record({"op": "release", "id": key}, "released")
        self.allocator.release_shm_allocation(base)

    def _pending(self) -> list[str]:
        return sorted(k for k, b in self.model.buffers.items() if b.pending_free)

    @precondition(lambda self: self._alive() and self._pending())
    @rule(data=st.data())
    @_saving
    def release_deferred(self, data: st.DataObject) -> None:
        """The holder of a buffer whose free was deferred lets go (the last one unmaps it)."""
        self._release(data.draw(st.sampled_from(self._pending()), label="key"))

    @precondition(lambda self: self._alive())
    @rule(data=st.data())
    @_saving
    def set_nr_hugepages(self, data: st.DataObject) -> None:
        size = data.draw(st.sampled_from(self.sizes), label="hugepage_size")
        pages = data.draw(st.integers(0, 2 if size >= GiB else 6), label="pages")
        nodes = [n.id for n in self.machine.nodes] if self.machine else [0]
        node = data.draw(st.one_of(st.none(), st.sampled_from(nodes)), label="node")
        self.model.set_nr_hugepages(size, pages, node)
        step = {"op": "set_nr_hugepages", "hugepage_size": size, "pages": pages, "node": node}
        self._record(step, f"nr_hugepages {self.model.counters(size).total}")
        self.host.set_nr_hugepages(size, pages, node)

    @precondition(lambda self: self.machine is not None and self.model.dead)
    @rule()
    def after_the_crash(self) -> None:
        """The simulated process is dead: nothing more to do but check the invariants."""

    # ---- invariants ----------------------------------------------------------------------
    @invariant()
    @_saving
    def counters_match(self) -> None:
        if self.machine is None:
            return
        for size in self.sizes:
            got, want = self.host.hugepages(size), self.model.counters(size)
            assert got == want, f"{format_size(size)}: {got}, model {want}"
            for n in self.machine.nodes:
                got = self.host.node_hugepages(n.id, size)
                want = self.model.counters(size, n.id)
                assert got == want, f"node {n.id} {format_size(size)}: {got}, model {want}"

    @invariant()
    @_saving
    def meminfo_matches(self) -> None:
        if self.machine is None or self.machine.default_hugepage_size is None:
            return
        info = self.host.meminfo()
        c = self.model.counters(self.machine.default_hugepage_size)
        got = tuple(info[k] for k in ("HugePages_Total", "HugePages_Free", "HugePages_Rsvd",
                                      "HugePages_Surp"))  # fmt: skip
        assert got == dataclasses.astuple(c), f"/proc/meminfo HugePages_*: {got}"
        if "Hugetlb" in info:
            kb = sum(self.model.counters(s).total * s for s in self.sizes) // 1024
            assert info["Hugetlb"] == kb, f"/proc/meminfo Hugetlb: {info['Hugetlb']} kB != {kb}"

    @invariant()
    @_saving
    def mappings_belong_to_buffers(self) -> None:
        if self.machine is None:
            return
        got = sorted((m.start, m.length) for m in self.host.mappings())
        want = sorted((self.bases[k], b.mapped) for k, b in self.model.buffers.items())
        assert got == want, f"mappings {got}, live buffers {want}"
        fds = len(self.host.open_fds())
        shm = sum(1 for b in self.model.buffers.values() if b.backing in SHM)
        assert fds == shm, f"{fds} open fds, {shm} live shm buffers"

    # ---- teardown ------------------------------------------------------------------------
    def teardown(self) -> None:
        _explored().advance(f"schedules ({type(self).steps_run} steps)")
        if self.machine is None or self.model.dead:
            return
        try:
            for key, buf in list(self.model.buffers.items()):
                while buf.registrations:
                    self.model.release(self.bases[key])
                    self.allocator.release_shm_allocation(self.bases[key])
            for key in list(self.model.buffers):
                self.model.free(key)
                self.allocator.free(self.handles[key])
            self.counters_match()
            leaks = collect_leaks(self.host, self.allocator, self.stack.kernel)
            assert not leaks, f"leaks after teardown: {leaks}"
        except Exception as e:
            self.save_failure(e)
            raise

    # ---- failures as scenarios -----------------------------------------------------------
    def expected_counters(self) -> dict[str, int]:
        out: dict[str, int] = {}
        assert self.machine is not None
        for size in self.sizes:
            k = size_key(size)
            for name, value in dataclasses.asdict(self.model.counters(size)).items():
                out[f"hugepages.{k}.{name}"] = value
            for n in self.machine.nodes:
                node = dataclasses.asdict(self.model.counters(size, n.id))
                del node["reserved"]  # the kernel keeps none per node: no such counter
                out.update({f"node{n.id}.hugepages.{k}.{name}": v for name, v in node.items()})
        return out

    def save_failure(self, error: BaseException) -> None:
        directory = save_dir()
        if directory is None or self.machine is None or not self.steps or self.saved:
            return
        self.saved = True
        # The runner does not clean up after steps: append the releases and frees a caller
        # owes, predicted by a copy of the model (release steps name the alloc's base, also
        # after the free, as umbp_sim.scenario.scenario_run does).
        model = copy.deepcopy(self.model)
        steps, expected = list(self.steps), list(self.expected_steps)
        if not model.dead:
            for key, buf in list(model.buffers.items()):
                while buf.registrations:
                    model.release(model.bases[key])
                    steps.append({"op": "release", "id": key})
                    expected.append("released")
            for key in model.live_keys():
                model.free(key)
                steps.append({"op": "free", "id": key})
                expected.append("freed")
        real = self.model
        self.model = model
        try:
            counters = self.expected_counters()
        finally:
            self.model = real
        expect: dict[str, Any] = {
            "outcome": self.expected_outcome,
            "steps": expected,
            "counters": counters,
        }
        if not model.dead:
            expect["no_leaks"] = True
        observed = " ".join(str(error).split())[:600]
        try:
            write_scenario(
                directory / f"{slug(self.save_name)}.toml",
                name=self.save_name,
                description=f"Shrunk by umbp_sim.explore; observed: {observed}",
                machine=self.machine,
                steps=steps,
                expect=expect,
                faults=self.fault_plan,
            )
        except UnwritableMachine:
            pass
