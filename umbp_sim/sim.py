"""A simulated host: ``simulate(machine)`` runs allocators on a SimKernel built from a Machine.

``SimHost`` is what the ``with`` block yields: the kernel, the machine it was built from, the
hugepage counters, live mappings, open (simulated) fds, the rendered /proc and /sys files and the
simulated crash, if any. One source of truth: every counter and file is read back from the
native SimKernel, never kept on the Python side.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from umbp_sim import _context, _native
from umbp_sim.errors import SimulatedCrash, UmbpSimError
from umbp_sim.host.arch_sizes import task_size
from umbp_sim.machine import MACHINE_FIELDS, Machine
from umbp_sim.vocabulary.meminfo import file_units
from umbp_sim.vocabulary.units import cgroup_hugetlb_name

__all__ = [
    "HugePages",
    "Mapping",
    "Reason",
    "SimHost",
    "HostNumbers",
    "HostState",
    "NodeNumbers",
    "build_kernel",
    "host_view",
    "overcommit_ratio_for",
    "simulate",
    "start_numbers",
    "to_sim_config",
]

_UNLIMITED = (1 << 64) - 1


@dataclass(frozen=True)
class HugePages:
    """Pool counters of one hugepage size (globally, or on one node: reserved is then 0). The
    fields are SimKernel's counters by their declared names, in order
    (``_native.HUGEPAGE_COUNTERS``: csrc/kernel/sim_kernel.h's UMBP_SIM_HUGEPAGE_COUNTERS)."""

    total: int
    free: int
    reserved: int
    surplus: int


@dataclass(frozen=True)
class Reason:
    """Why a simulated call failed (``errno``), why the process died (``signal``), or an event
    that decided an outcome (neither): the rule SimKernel applied and the numbers it compared.
    """

    call: str
    rule: str
    errno: str | None
    signal: str | None
    numbers: dict[str, int]
    text: str

    def to_json(self) -> dict[str, object]:
        """The reason as a JSON-ready dict (rule, call, errno or signal, its numbers, text)."""
        return asdict(self)


@dataclass(frozen=True)
class Mapping:
    """One live simulated mapping (VMA)."""

    start: int
    length: int
    prot: int
    flags: int
    page_size: int
    hugetlb: bool
    shared: bool
    policy_mode: int
    policy_nodes: tuple[int, ...]
    faulted_pages: int
    reserved_pages: int
    file_size: int  # a memfd's size; -1 for anonymous memory
    file_fds: tuple[int, ...]  # the memfd's open fds ...
    file_fds_cloexec: int  # ... and how many of them an exec closes (MFD_CLOEXEC)


@dataclass(frozen=True)
class NodeNumbers:
    """One node's MemFree, page cache and reclaimable slab (bytes), as SimKernel has them."""

    id: int
    mem_free: int
    page_cache: int
    slab_reclaimable: int


@dataclass(frozen=True)
class HostNumbers:
    """The numbers Linux derives from a host's raw facts, as SimKernel derives them
    (csrc/kernel/sim_rules.h): MemFree, MemAvailable (si_mem_available when the host does not
    give it), CommitLimit and each node's MemFree, page cache and SReclaimable, in bytes.
    ``start_numbers`` gives a Machine's at start, ``SimHost.numbers`` a running host's now."""

    mem_free: int
    mem_available: int
    commit_limit: int
    nodes: tuple[NodeNumbers, ...]

    @classmethod
    def from_native(cls, d: dict[str, Any]) -> HostNumbers:
        """The numbers from the binding's dict (``_native.host_numbers``, ``SimHost.numbers``)."""
        nodes = tuple(NodeNumbers(**n) for n in d["nodes"])
        return cls(d["mem_free"], d["mem_available"], d["commit_limit"], nodes)

    def node(self, node_id: int) -> NodeNumbers:
        """The numbers of node ``node_id``."""
        (found,) = [n for n in self.nodes if n.id == node_id]
        return found


def start_numbers(machine: Machine) -> HostNumbers:
    """What a SimKernel of ``machine`` starts with, derived by the same C++ code without
    building one (a dump being read, the picture of a host)."""
    return HostNumbers.from_native(_native.host_numbers(to_sim_config(machine)))


def overcommit_ratio_for(machine: Machine, commit_limit: int) -> int | None:
    """The smallest ``overcommit_ratio`` whose CommitLimit on ``machine`` reaches
    ``commit_limit`` bytes (SimKernel's vm_commit_limit solved), or None if none does."""
    return _native.overcommit_ratio_for(to_sim_config(machine), commit_limit)


def _unlimited(value: int | None) -> int:
    return value if value is not None else _UNLIMITED


def _said(value: bool | None) -> int:
    """1 or 0 as the host says, or -1: SimKernel applies its rule (sim_rules.h)."""
    return -1 if value is None else int(value)


def _given(value: int | None) -> int:
    """A number the host gives, or UNKNOWN: SimKernel derives it (sim_rules.h)."""
    return value if value is not None else _native.UNKNOWN


# How a Machine field becomes its SimConfig value when it is not a plain copy: the defaults a
# None stands for, resolved once here (MACHINE_FIELDS names the SimConfig field).
_RESOLVE: dict[str, Callable[[Machine], object]] = {
    "default_hugepage_size": lambda m: m.default_hugepage_size or 0,
    "possible_nodes": Machine.possible,
    "online_nodes": Machine.online,
    "mem_total": Machine.total_memory,
    "mem_free": lambda m: _given(m.mem_free),
    "mem_available": lambda m: _given(m.mem_available),
    "mem_available_line": lambda m: _said(m.mem_available_line),
    "watermark_low": lambda m: m.watermark_low or 0,
    "rlimit_as": lambda m: _unlimited(m.rlimit_as),
    "memcg_max": lambda m: _unlimited(m.memcg_max),
    "nodes": lambda m: _node_configs(m),
}


def _plain(value: object) -> object:
    """A copy of a list or dict (pybind11 converts it), anything else as it is."""
    return type(value)(value) if isinstance(value, (list, dict)) else value


def _node_configs(machine: Machine) -> list[_native.SimNodeConfig]:
    nodes = []
    for n in machine.nodes:
        nc = _native.SimNodeConfig()
        nc.id = n.id
        nc.mem_total = n.mem_total
        nc.mem_free = _given(n.mem_free)
        nc.page_cache = _given(n.page_cache)
        nc.slab_reclaimable = _given(n.slab_reclaimable)
        nc.cpulist = n.cpus
        nc.distances = list(n.distances or [])
        pools = {}
        for size, pool in n.hugepages.items():
            pc = _native.SimPoolConfig()
            pc.total = pool.total
            pc.free = pool.free_pages()
            pc.surplus = pool.surplus
            pools[size] = pc
        nc.hugepages = pools
        nodes.append(nc)
    return nodes


def to_sim_config(machine: Machine) -> _native.SimConfig:
    """The native starting state of ``machine`` (validated first): every field MACHINE_FIELDS
    maps to a SimConfig field, resolved by ``_RESOLVE`` or copied."""
    machine.validate()
    cfg = _native.SimConfig()
    for spec in MACHINE_FIELDS:
        if spec.cxx is not None:
            resolve = _RESOLVE.get(spec.name)
            value = resolve(machine) if resolve else _plain(getattr(machine, spec.name))
            setattr(cfg, spec.cxx, value)
    cfg.kernel_major, cfg.kernel_minor, _ = machine.kernel_tuple()
    cfg.task_size = task_size(machine.arch)
    return cfg


def build_kernel(machine: Machine) -> _native.SimKernel:
    """A fresh SimKernel in the state ``machine`` describes."""
    return _native.SimKernel(to_sim_config(machine))


def _limit(value: int | None, unlimited: str) -> str:
    return unlimited if value is None else str(value)


ALL_CAPS = (1 << 41) - 1  # CapEff of root on a 5.9+ kernel: capabilities 0-40


def credentials_text(privileged: bool) -> str:
    """The credential lines of /proc/self/status of a process that has (``privileged``: uid
    0 and every capability) or has not (uid 1000, none) CAP_SYS_ADMIN and CAP_SYS_NICE."""
    uid, caps = ("0", ALL_CAPS) if privileged else ("1000", 0)
    ids = "\t".join([uid] * 4)
    return (
        f"Uid:\t{ids}\nGid:\t{ids}\nCapPrm:\t{caps:016x}\nCapEff:\t{caps:016x}\n"
        f"CapBnd:\t{ALL_CAPS:016x}\n"
    )


def limit_files(machine: Machine) -> dict[str, str]:
    """/proc/self/limits (RLIMIT_AS), the credentials of /proc/self/status (``root``) and the
    cgroup v2 limits (memory.max, hugetlb.<size>.max,
    hugetlb.<size>.rsvd.max) as the kernel prints them. A run never changes them: they are the
    Machine's (SimKernel enforces them; it renders the files that change)."""
    rlimit = _limit(machine.rlimit_as, "unlimited")
    row = "{:<25} {:<20} {:<20} {:<10}\n".format
    files = {
        "/proc/self/limits": row("Limit", "Soft Limit", "Hard Limit", "Units")
        + row("Max address space", rlimit, rlimit, "bytes"),
        "/sys/fs/cgroup/memory.max": _limit(machine.memcg_max, "max") + "\n",
        "/proc/self/status": credentials_text(machine.root),
    }
    for size in machine.hugepage_sizes:
        cg = f"/sys/fs/cgroup/hugetlb.{cgroup_hugetlb_name(size)}"
        files[f"{cg}.max"] = _limit(machine.hugetlb_cgroup_max.get(size), "max") + "\n"
        files[f"{cg}.rsvd.max"] = _limit(machine.hugetlb_cgroup_rsvd_max.get(size), "max") + "\n"
    return files


def _pool_size(machine: Machine, size: int | None) -> int:
    """``size``, or the default hugepage size; an error when the host has no such size."""
    s = size if size is not None else machine.default_hugepage_size
    if s is None or s not in machine.hugepage_sizes:
        raise UmbpSimError(f"hugepage size {s}: not a size of this host")
    return s


class SimHost:
    """A simulated host: its kernel, counters, mappings, fds, files and crash."""

    def __init__(self, machine: Machine, kernel: _native.SimKernel | None = None) -> None:
        self.machine = machine
        self.kernel = kernel if kernel is not None else build_kernel(machine)

    # ---- counters ------------------------------------------------------------------------
    def _size(self, size: int | None) -> int:
        return _pool_size(self.machine, size)

    def hugepages(self, size: int | None = None) -> HugePages:
        """Global counters of ``size`` (default: the default hugepage size)."""
        return HugePages(*self.kernel.hugepage_counters(self._size(size), -1))

    def node_hugepages(self, node: int, size: int | None = None) -> HugePages:
        """Node ``node``'s counters of ``size`` (its HugePages_Rsvd is always 0: Rsvd is global)."""
        c = self.kernel.hugepage_counters(self._size(size), node)
        if not c:
            raise UmbpSimError(f"node {node}: not a node of this host")
        return HugePages(*c)

    def meminfo(self) -> dict[str, int]:
        """/proc/meminfo as {label: value} (kB for sizes, pages for HugePages_*)."""
        return file_units(self.kernel.read_file("/proc/meminfo"))

    def mappings(self) -> list[Mapping]:
        """The simulated process's live mappings (address, length, page size, NUMA policy)."""
        return [
            Mapping(
                **{**m, "policy_nodes": tuple(m["policy_nodes"]), "file_fds": tuple(m["file_fds"])}
            )
            for m in self.kernel.mappings()
        ]

    def mapping_at(self, addr: int) -> Mapping | None:
        """The live mapping that holds ``addr``, or None."""
        return next((m for m in self.mappings() if m.start <= addr < m.start + m.length), None)

    def open_fds(self) -> list[int]:
        """The simulated process's open file descriptors (memfds the allocator holds)."""
        return list(self.kernel.open_fds())

    def reasons(self) -> list[Reason]:
        """What SimKernel recorded: every errno, every signal, and the deciding events."""
        return [Reason(**r) for r in self.kernel.reasons()]

    def numbers(self) -> HostNumbers:
        """MemFree, MemAvailable, CommitLimit and each node's MemFree, page cache and
        SReclaimable now, as the kernel shows them (bytes)."""
        return HostNumbers.from_native(self.kernel.host_numbers())

    def reclaimable(self, node: int | None = None) -> int:
        """Page cache + SReclaimable left, on ``node`` or the whole host (bytes)."""
        return int(self.kernel.reclaimable(-1 if node is None else node))

    def state(self) -> HostState:
        """The counters and numbers now, kept as data (a run's host after its admin writes)."""
        pools = {}
        for size in self.machine.hugepage_sizes:
            pools[size, -1] = self.hugepages(size)
            for n in self.machine.node_ids():
                pools[size, n] = self.node_hugepages(n, size)
        reclaimable = {n: self.reclaimable(n) for n in self.machine.node_ids()}
        return HostState(self.machine, self.numbers(), pools, reclaimable)

    # ---- files ---------------------------------------------------------------------------
    def files(self) -> dict[str, str]:
        """Every rendered /proc and /sys file: {absolute path: contents}: the kernel's, and the
        process limits and cgroup files (``limit_files``) a dump holds too."""
        return {**self.kernel.render_all(), **limit_files(self.machine)}

    def read(self, path: str) -> str:
        """One rendered file, as the kernel would show it now: ``host.read("/proc/meminfo")``
        (or one of ``limit_files``)."""
        fixed = limit_files(self.machine).get(path)
        return fixed if fixed is not None else self.kernel.read_file(path)

    def render(self, directory: str | os.PathLike[str]) -> list[Path]:
        """Write the rendered files under ``directory`` (``dir/proc/meminfo``, ...)."""
        root = Path(directory)
        written = []
        for path, text in self.files().items():
            target = root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            written.append(target)
        return written

    # ---- crash ---------------------------------------------------------------------------
    @property
    def crash(self) -> SimulatedCrash | None:
        info = self.kernel.crash_info()
        return None if info is None else SimulatedCrash(**info)

    # ---- admin ---------------------------------------------------------------------------
    def set_nr_hugepages(self, size: int | None, count: int, node: int | None = None) -> None:
        """``echo count > nr_hugepages`` (global, interleaved) or nodeN's file."""
        self.kernel.set_nr_hugepages(self._size(size), count, -1 if node is None else node)

    def set_nr_overcommit_hugepages(self, size: int | None, count: int) -> None:
        """``echo count > nr_overcommit_hugepages`` of ``size`` (surplus pages allowed at mmap)."""
        self.kernel.set_nr_overcommit_hugepages(self._size(size), count)

    def __repr__(self) -> str:
        return f"<SimHost {self.machine.name} kernel {self.machine.kernel_version}>"


@dataclass(frozen=True)
class HostState:
    """A simulated host's counters and numbers at one moment, as data (``SimHost.state``): the
    questions a replay asks of a host (free pages, node memory) answered without a kernel of
    its own. A run that keeps it (``Run.keep_state``) records the state its admin writes left,
    before the work: for the baseline that is the dumped host, for a fix the host it makes."""

    machine: Machine
    numbers: HostNumbers
    pools: dict[tuple[int, int], HugePages]  # (size, node; -1: global) -> counters
    reclaimables: dict[int, int]  # node -> page cache + SReclaimable left, bytes

    def _size(self, size: int | None) -> int:
        return _pool_size(self.machine, size)

    def hugepages(self, size: int | None = None) -> HugePages:
        """Global counters of ``size`` (default: the default hugepage size)."""
        return self.pools[self._size(size), -1]

    def node_hugepages(self, node: int, size: int | None = None) -> HugePages:
        """Node ``node``'s counters of ``size``."""
        found = self.pools.get((self._size(size), node))
        if found is None:
            raise UmbpSimError(f"node {node}: not a node of this host")
        return found

    def reclaimable(self, node: int | None = None) -> int:
        """Page cache + SReclaimable left, on ``node`` or the whole host (bytes)."""
        if node is None:
            return sum(self.reclaimables.values())
        return self.reclaimables.get(node, 0)


_VIEWS: dict[str, SimHost] = {}
_MAX_VIEWS = 8
_VIEWS_LOCK = threading.Lock()


def _new_lock_in_child() -> None:
    # A thread of the parent may have held it at fork(): the child's copy would stay taken.
    global _VIEWS_LOCK
    _VIEWS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_in_child)


def host_view(machine: Machine) -> SimHost:
    """A SimHost of ``machine`` in its starting state, for questions only (counters, files):
    one SimKernel per machine state, shared by every caller asking about that state (a replay
    asks several). Never run an allocator on it nor change it; ``SimHost(machine)`` is a host
    of one's own."""
    key = repr(machine)
    with _VIEWS_LOCK:
        host = _VIEWS.get(key)
        if host is None:
            if len(_VIEWS) >= _MAX_VIEWS:
                del _VIEWS[next(iter(_VIEWS))]
            host = _VIEWS[key] = SimHost(machine.copy())
    return host


@contextlib.contextmanager
def simulate(machine: Machine) -> Iterator[SimHost]:
    """Run allocators created inside the block, on this thread, on a SimKernel built from
    ``machine``. Per thread: other threads (also those started inside the block) stay on the
    real kernel; give them ``UMBPHostMemAllocator(kernel=host.kernel)`` to share the host."""
    host = SimHost(machine)
    _context.push_kernel(host.kernel)
    try:
        yield host
    finally:
        _context.pop_kernel(host.kernel)
