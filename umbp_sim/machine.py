"""The declarative description of a host: what the simulated kernel starts from.

A ``Machine`` is plain data. The SimKernel is built from it (``umbp_sim.sim``), dumps are parsed
into it (``umbp_sim.dump``), scenario files describe it. All sizes are bytes; constructors and
``Machine.build`` accept strings such as ``"2MiB"`` through ``parse_size``.

Pool state is kept the way the kernel keeps it (docs/kernel-model.md section 0): per hugepage
size and node ``total``/``free``/``surplus``; per size the global ``reserved`` count and
``nr_overcommit_hugepages``. ``free`` and ``reserved`` describe pages other processes already
hold when the simulation starts (a dump of a busy host).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import re
import warnings
from dataclasses import dataclass, field
from typing import Any

from umbp_sim.host.arch_sizes import (
    ARM64_SIZES,
    PPC64_SIZES,
    GiB,
    KiB,
    MiB,
    default_hugepage_sizes,
    pmd_size,
)
from umbp_sim.host.host_nodes import MAX_NODE_ID, NODE_ID, PAGES, HugePool, Node, node_ok
from umbp_sim.vocabulary.bounded import short_list
from umbp_sim.vocabulary.units import parse_size
from umbp_sim.vocabulary.value_types import (
    MAX_BYTES,
    MAX_INT,
    Array,
    Bool,
    Custom,
    Int,
    Size,
    Spec,
    Str,
    Table,
    ValueTypeError,
)

TiB = 1 << 40


class MachineError(ValueError):
    """An inconsistent machine description; the message names the field."""


_MISSING: Any = dataclasses.MISSING


def _f(default: Any, unit: str, doc: str, cxx_type: str | None, dump: str | None) -> Any:
    """One Machine field and its declaration (read back as ``MACHINE_FIELDS``); a callable
    ``default`` is a factory (a fresh list or dict per Machine)."""
    meta = {"unit": unit, "doc": doc, "cxx_type": cxx_type, "dump": dump}
    if callable(default):
        return field(default_factory=default, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class Machine:
    """A host as the allocator sees it: arch, page and hugepage sizes, NUMA nodes and their
    pools, overcommit settings, limits and kernel version. Build one with ``Machine.build``,
    ``Machine.x86_64``, ``Machine.arm64`` or ``Machine.ppc64le``, or load a dumped host
    (``umbp_sim.dump``).

    >>> m = Machine.x86_64(nodes=2, mem_per_node="64GiB", hugepages={"2MiB": 1024})
    >>> m.pool_total(2 << 20), m.node_ids()
    (1024, [0, 1])
    """

    # One declaration per field: default, unit, meaning, the type of the SimConfig field of the
    # same name it fills (csrc/kernel/sim_config.h; None: Python only; SIM_CONFIG_NAMES renames)
    # and the file of a dump that carries it (None: a dump cannot say). MACHINE_FIELDS reads it
    # back; the scenario keys, to_sim_config, the binding check and the dump round trip use it.
    # fmt: off
    arch: str = _f("x86_64", "", '"x86_64", "arm64", "ppc64le", "s390x", ...; with page_size '
                   "picks the hugepage sizes", None,
                   "umbp-sim-collect.json machine, proc/cpuinfo, the kernel string, the sizes")
    page_size: int = _f(4096, "bytes", 'base page size; arm64 also "16KiB" or "64KiB", '
                        'ppc64le "64KiB"', "int",
                        "umbp-sim-collect.json page_size, else from the arch and the sizes")
    # Hugepage sizes registered at boot (directories under /sys/kernel/mm/hugepages).
    hugepage_sizes: list[int] = _f(lambda: [2 * MiB, GiB], "bytes",
                                   "hugepage sizes registered at boot, by arch and page size "
                                   "(x86_64: 2M and 1G; arm64 64K: 2M, 512M, 16G; ppc64le: "
                                   'radix\'s 2M and 1G, ["16MiB", "16GiB"] for a hash MMU); '
                                   "empty: a kernel without CONFIG_HUGETLB_PAGE",
                                   "list[int]", "sys/kernel/mm/hugepages/hugepages-<N>kB")
    default_hugepage_size: int | None = _f(2 * MiB, "bytes", "Hugepagesize of /proc/meminfo "
                                           "(the PMD size); None only without hugepage sizes",
                                           "int", "proc/meminfo Hugepagesize")
    nodes: list[Node] = _f(lambda: [Node(0, 16 * GiB)], "", "the NUMA nodes: memory, CPUs, "
                           "hugepage pools, distances", "list[SimNodeConfig]",
                           "sys/devices/system/node/nodeN")
    possible_nodes: list[int] | None = _f(None, "node ids", "possible nodes (a possible node "
                                          "that is not a node of the machine has no memory); "
                                          "None: the node ids", "list[int]",
                                          "sys/devices/system/node/possible")
    online_nodes: list[int] | None = _f(None, "node ids", "online nodes; None: the node ids",
                                        "list[int]", "sys/devices/system/node/online")
    numa_sysfs: bool = _f(True, "", "whether /sys/devices/system/node exists (not on s390)",
                          "bool", "sys/devices/system/node")
    hugepages_reserved: dict[int, int] = _f(dict, "size -> pages", "HugePages_Rsvd other "
                                            'processes hold at start: { "2MiB" = 768 }',
                                            "dict[int, int]",
                                            "sys/kernel/mm/hugepages/*/resv_hugepages")
    nr_overcommit_hugepages: dict[int, int] = _f(dict, "size -> pages", "surplus pages the "
                                                 'kernel may allocate at mmap: { "2MiB" = 1024 }',
                                                 "dict[int, int]",
                                                 "sys/kernel/mm/hugepages/*/nr_overcommit_hugepages")
    overcommit_memory: int = _f(0, "mode", "vm.overcommit_memory (0, 1 or 2)", "int",
                                "proc/sys/vm/overcommit_memory")
    overcommit_ratio: int = _f(50, "percent", "vm.overcommit_ratio", "int",
                               "proc/sys/vm/overcommit_ratio")
    overcommit_kbytes: int = _f(0, "kB", "vm.overcommit_kbytes (0: the ratio applies)", "int",
                                "proc/sys/vm/overcommit_kbytes")
    swap_total: int = _f(0, "bytes", "SwapTotal", "int", "proc/meminfo SwapTotal")
    mem_total: int | None = _f(None, "bytes", "MemTotal; None: the sum of the nodes'", "int",
                               "proc/meminfo MemTotal")
    mem_free: int | None = _f(None, "bytes", "MemFree; None: the sum of the nodes'", "int",
                              "proc/meminfo MemFree")
    mem_available: int | None = _f(None, "bytes", "MemAvailable, what sglang's host check "
                                   "reads; None: estimated as si_mem_available does", "int",
                                   "proc/meminfo MemAvailable (else estimated)")
    # RHEL 7's 3.10 prints MemAvailable (backported).
    mem_available_line: bool | None = _f(None, "", "whether /proc/meminfo prints MemAvailable; "
                                         "None: kernel 3.14+ (RHEL 7's 3.10 has it)", "int",
                                         "proc/meminfo MemAvailable")
    # Linux reclaims both before the OOM killer runs; MemAvailable counts them.
    page_cache: int = _f(0, "bytes", "the file LRU (Active(file) + Inactive(file)): faults take "
                         "free memory first, then reclaim it and slab_reclaimable, and only then "
                         "call the OOM killer; spread over the nodes by MemTotal", "int",
                         "proc/meminfo Active(file), Inactive(file)")
    slab_reclaimable: int = _f(0, "bytes", "SReclaimable (reclaimed like page_cache)", "int",
                               "proc/meminfo SReclaimable")
    watermark_low: int | None = _f(None, "bytes", "sum of the zones' low watermarks (/proc/"
                                   "zoneinfo low), for MemAvailable's estimate; None: 0", "int",
                                   "proc/zoneinfo low")
    committed_as: int = _f(0, "bytes", "Committed_AS of other processes at start", "int",
                           "proc/meminfo Committed_AS")
    admin_reserve_kbytes: int = _f(8192, "kB", "vm.admin_reserve_kbytes: what overcommit_memory "
                                   "2 keeps back for root", "int",
                                   "proc/sys/vm/admin_reserve_kbytes")
    user_reserve_kbytes: int = _f(131072, "kB", "vm.user_reserve_kbytes: what overcommit_memory "
                                  "2 keeps back from a process", "int",
                                  "proc/sys/vm/user_reserve_kbytes")
    rlimit_as: int | None = _f(None, "bytes", "RLIMIT_AS (ulimit -v); None: unlimited", "int",
                               "proc/self/limits")
    memcg_max: int | None = _f(None, "bytes", "the memory cgroup's memory.max: anonymous faults "
                               "beyond it are an OOM kill (SIGKILL); None: max", "int",
                               "sys/fs/cgroup/memory.max")
    hugetlb_cgroup_max: dict[int, int] = _f(dict, "size -> bytes", "hugetlb.<size>.max, "
                                            "enforced at fault time (SIGBUS, or EFAULT from "
                                            'MADV_POPULATE_WRITE): { "2MiB" = "512MiB" }',
                                            "dict[int, int]", "sys/fs/cgroup/hugetlb.<size>.max")
    hugetlb_cgroup_rsvd_max: dict[int, int] = _f(dict, "size -> bytes", "hugetlb.<size>.rsvd.max"
                                                 ", enforced at mmap (reservation) time",
                                                 "dict[int, int]",
                                                 "sys/fs/cgroup/hugetlb.<size>.rsvd.max")
    root: bool = _f(True, "", "the process has CAP_SYS_ADMIN / CAP_SYS_NICE (admin reserve, "
                    "MPOL_MF_MOVE_ALL)", "bool",
                    "proc/self/status CapEff (the server's: collect --pid)")
    kernel_version: str = _f("6.18.0", "", "kernel release; decides MADV_POPULATE_WRITE (5.14), "
                             "MFD_HUGETLB (4.14), memfd_create (3.17), MemAvailable (3.14)",
                             "str", "proc/sys/kernel/osrelease")
    name: str = _f("sim", "", "the host's name", None, "the dump's file or directory name")
    # fmt: on

    # ---- derived facts -------------------------------------------------------------------
    def node_ids(self) -> list[int]:
        """The ids of the nodes, in order."""
        return [n.id for n in self.nodes]

    def possible(self) -> list[int]:
        """The possible nodes (/sys/devices/system/node/possible)."""
        return list(self.possible_nodes) if self.possible_nodes is not None else self.node_ids()

    def online(self) -> list[int]:
        """The online nodes (/sys/devices/system/node/online)."""
        return list(self.online_nodes) if self.online_nodes is not None else self.node_ids()

    def kernel_tuple(self) -> tuple[int, int, int]:
        """``kernel_version`` as numbers: "5.14.0-70" -> (5, 14, 0)."""
        return parse_kernel_version(self.kernel_version)

    def pool_total(self, size: int) -> int:
        """Pages of hugepage ``size`` (bytes) on all nodes together."""
        return sum(n.hugepages.get(size, HugePool()).total for n in self.nodes)

    def pool_free(self, size: int) -> int:
        """Free pages of hugepage ``size`` (bytes) on all nodes together."""
        return sum(n.hugepages.get(size, HugePool()).free_pages() for n in self.nodes)

    def total_memory(self) -> int:
        """MemTotal in bytes: ``mem_total``, or the sum of the nodes'."""
        if self.mem_total is not None:
            return self.mem_total
        return sum(n.mem_total for n in self.nodes)

    def copy(self) -> Machine:
        """A deep copy (nodes and pools included), to change without touching this one."""
        return copy.deepcopy(self)

    # ---- validation ----------------------------------------------------------------------
    def validate(self) -> Machine:
        """Raise MachineError naming the first inconsistent field; return self."""
        for name, spec in _FIELD_TYPES.items():
            value = getattr(self, name)
            if value is not None or name not in _OPTIONAL:
                _checked(spec, value, name)
        if self.page_size <= 0 or self.page_size & (self.page_size - 1):
            raise MachineError(f"page_size: {self.page_size} is not a power of two")
        for s in self.hugepage_sizes:
            if s <= self.page_size or s & (s - 1):
                raise MachineError(
                    f"hugepage_sizes: {s} must be a power of two larger than page_size"
                )
        if self.default_hugepage_size is not None and (
            self.default_hugepage_size not in self.hugepage_sizes
        ):
            raise MachineError(
                f"default_hugepage_size: {self.default_hugepage_size} is not in hugepage_sizes"
            )
        if self.hugepage_sizes and self.default_hugepage_size is None:
            raise MachineError("default_hugepage_size: required when hugepage_sizes is set")
        ids = self.node_ids()
        if len(set(ids)) != len(ids):
            seen: set[int] = set()
            dup = next(i for i in ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
            raise MachineError(f"nodes: duplicate node id {dup} in {short_list(ids)}")
        possible = set(self.possible())
        for i in self.online():
            if i not in possible:
                raise MachineError(f"online_nodes: node {i} is not in possible_nodes")
        for n in self.nodes:
            if n.mem_total < 0:
                raise MachineError(f"nodes[{n.id}].mem_total: negative")
            for size, pool in n.hugepages.items():
                where = f"nodes[{n.id}].hugepages[{size}]"
                if size not in self.hugepage_sizes:
                    raise MachineError(f"{where}: size {size} is not in hugepage_sizes")
                if pool.total < 0 or pool.surplus < 0:
                    raise MachineError(f"{where}: negative page count")
                if not 0 <= pool.free_pages() <= pool.total:
                    raise MachineError(f"{where}: free {pool.free} outside 0..{pool.total}")
                if pool.surplus > pool.total:
                    raise MachineError(f"{where}: surplus {pool.surplus} > total {pool.total}")
        for what, table in (
            ("hugepages_reserved", self.hugepages_reserved),
            ("nr_overcommit_hugepages", self.nr_overcommit_hugepages),
            ("hugetlb_cgroup_max", self.hugetlb_cgroup_max),
            ("hugetlb_cgroup_rsvd_max", self.hugetlb_cgroup_rsvd_max),
        ):
            for size, v in table.items():
                if size not in self.hugepage_sizes:
                    raise MachineError(f"{what}: size {size} is not in hugepage_sizes")
                if v < 0:
                    raise MachineError(f"{what}[{size}]: negative")
        for size, resv in self.hugepages_reserved.items():
            if resv > self.pool_free(size):
                raise MachineError(
                    f"hugepages_reserved[{size}]: {resv} reserved but only "
                    f"{self.pool_free(size)} free"
                )
        if self.overcommit_memory not in (0, 1, 2):
            raise MachineError(f"overcommit_memory: {self.overcommit_memory} is not 0, 1 or 2")
        parse_kernel_version(self.kernel_version)
        self._check_ranges()
        return self

    def _check_ranges(self) -> None:
        """Every number fits the simulator (value_types: bytes below 2**62, ints)."""

        def fits(what: str, value: int | None, unit: int = 1, top: int = MAX_BYTES) -> None:
            if value is not None and value * unit >= top:
                shown = "2^62 bytes" if top == MAX_BYTES else str(top)
                raise MachineError(
                    f"{what}: {value} is beyond what the simulator holds (below {shown})"
                )

        fits("page_size", self.page_size)
        for s in self.hugepage_sizes:
            fits("hugepage_sizes", s)
        pool_bytes: dict[int, int] = {}
        for n in self.nodes:
            fits(f"nodes[{n.id}].mem_total", n.mem_total)
            fits(f"nodes[{n.id}].mem_free", n.mem_free)
            for size, pool in n.hugepages.items():
                fits(f"nodes[{n.id}].hugepages[{size}].total", pool.total, size)
                pool_bytes[size] = pool_bytes.get(size, 0) + pool.total * size
        fits("nodes: memory of all nodes", sum(n.mem_total for n in self.nodes))
        fits("nodes: hugepage pools of all nodes", sum(pool_bytes.values()))
        for size, v in self.hugepages_reserved.items():
            fits(f"hugepages_reserved[{size}]", v, size)
        for size, v in self.nr_overcommit_hugepages.items():
            fits(f"nr_overcommit_hugepages[{size}]", v, size)
        for key in sorted(_SIZE_VALUED_FIELDS):
            for size, v in getattr(self, key).items():
                fits(f"{key}[{size}]", v)
        fits("overcommit_ratio", self.overcommit_ratio, top=MAX_INT + 1)
        if self.overcommit_ratio < 0:
            raise MachineError(f"overcommit_ratio: negative ({self.overcommit_ratio})")
        # a bound on SimKernel's CommitLimit (csrc/kernel/sim_rules.h), not the rule itself
        fits("overcommit_ratio * memory", self.total_memory() * self.overcommit_ratio // 100)
        fits("overcommit_kbytes", self.overcommit_kbytes, KiB)
        for what in ("swap_total", "mem_total", "mem_free", "mem_available", "committed_as",
                     "rlimit_as", "memcg_max", "watermark_low"):  # fmt: skip
            fits(what, getattr(self, what))
        fits("admin_reserve_kbytes", self.admin_reserve_kbytes, KiB)
        fits("user_reserve_kbytes", self.user_reserve_kbytes, KiB)

    # ---- construction (a dumped host: umbp_sim.dump.load_machine) -----------------------
    @classmethod
    def from_dump(cls, path: Any) -> Machine:
        """Deprecated alias of ``umbp_sim.dump.load_machine(path)`` (a host from a dump)."""
        warnings.warn(
            "Machine.from_dump is deprecated: use umbp_sim.dump.load_machine(path)",
            DeprecationWarning,
            stacklevel=2,
        )
        # By name at call time: machine.py holds no import of the dump reader (the layers'
        # rule, tests/test_import_cycles.py); only this deprecated alias reaches it.
        machine: Machine = importlib.import_module("umbp_sim.dump").load_machine(path)
        return machine

    @classmethod
    def build(
        cls,
        *,
        nodes: int = 1,
        mem_per_node: int | str = "16GiB",
        hugepages: dict[int | str, int] | None = None,
        hugepages_per_node: list[dict[int | str, int]] | None = None,
        page_size: int | str = 4096,
        hugepage_sizes: list[int | str] | None = None,
        default_hugepage_size: int | str | None = None,
        arch: str = "x86_64",
        **kw: object,
    ) -> Machine:
        """A host from a few numbers.

        ``hugepages={"2MiB": 1024}`` spreads pages over the nodes the way writing
        ``vm.nr_hugepages`` does (interleaved, node 0 first); ``hugepages_per_node`` gives each
        node's count explicitly. Remaining keywords set Machine fields (sizes parsed).
        A value of the wrong type or beyond the simulator is a MachineError naming it, before
        any work (``nodes=10**9`` builds no node).
        """
        given = {"nodes": nodes, "mem_per_node": mem_per_node, "hugepages": hugepages,
                 "hugepages_per_node": hugepages_per_node, "page_size": page_size,
                 "hugepage_sizes": hugepage_sizes,
                 "default_hugepage_size": default_hugepage_size, "arch": arch}  # fmt: skip
        for key, value in given.items():
            if value is not None or key not in _BUILD_OPTIONAL:
                _checked(BUILD_TYPES[key], value, key)
        ps = parse_size(page_size, "page_size")
        sizes: list[int] = (
            [parse_size(s, "hugepage_sizes") for s in hugepage_sizes]
            if hugepage_sizes is not None
            else default_hugepage_sizes(arch, ps)
        )
        default = (
            parse_size(default_hugepage_size, "default_hugepage_size")
            if default_hugepage_size is not None
            else (pmd_size(arch, ps, sizes) if sizes else None)
        )
        mem = parse_size(mem_per_node, "mem_per_node")
        node_list = [Node(i, mem) for i in range(nodes)]
        if hugepages_per_node is not None:
            if len(hugepages_per_node) != nodes:
                raise MachineError(
                    f"hugepages_per_node: {len(hugepages_per_node)} entries for {nodes} nodes"
                )
            for node, pools in zip(node_list, hugepages_per_node, strict=True):
                for s, count in pools.items():
                    node.hugepages[parse_size(s, "hugepages_per_node")] = HugePool(count)
        from umbp_sim import _native  # lazy: machine.py stays import-light

        for s, count in (hugepages or {}).items():
            size = parse_size(s, "hugepages")
            # SimKernel's round robin of a vm.nr_hugepages write
            for node, share in zip(node_list, _native.interleave(count, nodes), strict=True):
                pool = node.hugepages.setdefault(size, HugePool())
                pool.total += share
        m = cls(
            arch=arch,
            page_size=ps,
            hugepage_sizes=sizes,
            default_hugepage_size=default,
            nodes=node_list,
        )
        return m.apply(**kw)

    def apply(self, **fields: object) -> Machine:
        """Set Machine fields by name (sizes as in ``build``), validate, and return self."""
        for key, value in fields.items():
            if key not in _FIELD_NAMES:
                raise MachineError(f"{key}: not a Machine field")
            if value is not None or key not in _OPTIONAL:
                _checked(WRITTEN_TYPES[key], value, key)
            if key in _SIZE_FIELDS and value is not None:
                value = parse_size(value, key)  # type: ignore[arg-type]
            if key in SIZE_TABLE_FIELDS and isinstance(value, dict):
                value = {
                    parse_size(k, key): (parse_size(v, key) if key in _SIZE_VALUED_FIELDS else v)
                    for k, v in value.items()
                }
            setattr(self, key, value)
        return self.validate()

    @classmethod
    def x86_64(cls, **kw: object) -> Machine:
        """An x86_64 host: 4 KiB pages, 2 MiB and 1 GiB hugepage sizes, default 2 MiB."""
        return cls.build(arch="x86_64", page_size=4096, **kw)  # type: ignore[arg-type]

    @classmethod
    def ppc64le(cls, mmu: str = "radix", **kw: object) -> Machine:
        """A ppc64le (POWER) host: 64 KiB pages and the hugepage sizes of its MMU, ``radix``
        (2 MiB and 1 GiB, default 2 MiB: POWER9 and later) or ``hash`` (16 MiB and 16 GiB,
        default 16 MiB: POWER8 and earlier, and POWER9 LPARs)."""
        if mmu not in PPC64_SIZES:
            raise MachineError(f"mmu: ppc64le has a 'hash' or 'radix' MMU, not {mmu!r}")
        kw.setdefault("hugepage_sizes", default_hugepage_sizes("ppc64le", 64 * KiB, mmu))
        return cls.build(arch="ppc64le", page_size=64 * KiB, **kw)  # type: ignore[arg-type]

    @classmethod
    def arm64(cls, page_size: int | str = "4KiB", **kw: object) -> Machine:
        """An arm64 host with a 4K, 16K or 64K base page and that granule's hugepage sizes."""
        ps = parse_size(page_size, "page_size")
        if ps not in ARM64_SIZES:
            raise MachineError(f"page_size: arm64 has 4KiB, 16KiB or 64KiB pages, not {ps}")
        return cls.build(arch="arm64", page_size=ps, **kw)  # type: ignore[arg-type]


@dataclass(frozen=True)
class FieldSpec:
    """One Machine field as declared: name, Python type, unit, default, meaning, the SimConfig
    field it fills (None: Python only) with that field's type, and the dump file carrying it
    (None: a dump cannot say; the loader notes the default it takes)."""

    name: str
    type: str
    unit: str
    default: object
    doc: str
    cxx: str | None
    cxx_type: str | None
    dump: str | None


# Machine fields whose SimConfig field has another name.
SIM_CONFIG_NAMES = {"mem_available_line": "show_mem_available", "kernel_version": "kernel_release"}


def _specs() -> tuple[FieldSpec, ...]:
    out = []
    for f in dataclasses.fields(Machine):
        default = f.default if f.default is not _MISSING else f.default_factory()  # type: ignore[misc,operator]
        cxx = SIM_CONFIG_NAMES.get(f.name, f.name) if f.metadata["cxx_type"] else None
        out.append(FieldSpec(f.name, str(f.type), default=default, cxx=cxx, **f.metadata))
    return tuple(out)


MACHINE_FIELDS: tuple[FieldSpec, ...] = _specs()
# SimConfig fields Python fills that are no Machine field: parts of kernel_version, the VM
# the simulated process already has (left 0: the allocator's mappings are all it has) and the
# size of its address space (``task_size``, from arch).
SIM_CONFIG_DERIVED = {
    "kernel_major": "int",
    "kernel_minor": "int",
    "base_vm": "int",
    "task_size": "int",
}
_FIELD_NAMES = {f.name for f in MACHINE_FIELDS}
# Sizes given as "2MiB" strings: bytes-valued numbers, and {size: ...} tables.
_SIZE_FIELDS = {
    f.name for f in MACHINE_FIELDS if f.unit == "bytes" and f.type in ("int", "int | None")
}
SIZE_TABLE_FIELDS = {f.name for f in MACHINE_FIELDS if f.unit.startswith("size ->")}
_SIZE_VALUED_FIELDS = {f.name for f in MACHINE_FIELDS if f.unit == "size -> bytes"}

# The keys of a scenario's [machine] table: Machine.build's keywords, every Machine field
# (``nodes`` is build's node count there) and the scenario runner's free_hugepages_per_node.
BUILD_KEYWORDS = frozenset(inspect.signature(Machine.build).parameters) - {"cls", "kw"}
# build's keywords that describe the nodes and their pools (``nodes`` is their count), in its
# order: a dumped host has its own, so a scenario cannot give them beside a dump.
NODE_AND_POOL_KEYWORDS = tuple(
    k for k in inspect.signature(Machine.build).parameters
    if k in BUILD_KEYWORDS and (k == "nodes" or k not in _FIELD_NAMES)
)  # fmt: skip
SCENARIO_MACHINE_KEYS = frozenset(_FIELD_NAMES | BUILD_KEYWORDS | {"free_hugepages_per_node"})
# What the [machine] keys that are no Machine field mean (``nodes`` there is build's count);
# with the fields' declarations they make scenarios/README.md's table (tools/generated.py).
SCENARIO_KEY_DOCS = {
    "nodes": "number of NUMA nodes, ids 0..n-1",
    "mem_per_node": "MemTotal of each node",
    "hugepages": '{ "2MiB" = 1024 }: pages per size, interleaved over the nodes as writing '
    "vm.nr_hugepages does (node 0 first)",
    "hugepages_per_node": '[{ "2MiB" = 1024 }, { "2MiB" = 0 }]: one table per node',
    "free_hugepages_per_node": '[{ "2MiB" = 16 }, ...]: free pages per node and size, when other '
    "processes already hold pages (free < total)",
}
assert set(SCENARIO_KEY_DOCS) == (SCENARIO_MACHINE_KEYS - _FIELD_NAMES) | {"nodes"}

# ---- the type of each field, as written (scenario [machine] tables, ``apply``) and as held ----
_OPTIONAL = {f.name for f in MACHINE_FIELDS if f.type.endswith("| None")}


def _field_type(spec: FieldSpec, written: bool) -> Spec:
    """The declared field's value type: sizes as ``"2MiB"`` strings only when ``written``."""
    size = Size(written=written)
    if spec.name == "nodes":
        return Array(Custom(node_ok, "a Node"), min_len=1, max_len=MAX_NODE_ID + 1)
    base = spec.type.removesuffix(" | None")
    if base == "str":
        return Str()
    if base == "bool":
        return Bool()
    if base == "int":
        if spec.unit == "bytes":
            return size
        if spec.unit == "kB":
            return Int(0, MAX_BYTES // 1024 - 1, "kB is beyond what the simulator holds "
                       "(below 2^62 bytes)")  # fmt: skip
        if spec.unit == "mode":
            return Int(0, 2)
        return Int(0, (1 << 31) - 1)
    if base == "list[int]":
        if spec.unit == "bytes":
            return Array(size, max_len=16)
        return Array(NODE_ID, max_len=MAX_NODE_ID + 1)
    if base == "dict[int, int]":
        value = size if spec.unit == "size -> bytes" else PAGES
        return Table(value, key=size, max_len=16)
    raise AssertionError(f"no value type for Machine.{spec.name}: {spec.type}")


_FIELD_TYPES: dict[str, Spec] = {f.name: _field_type(f, written=False) for f in MACHINE_FIELDS}
WRITTEN_TYPES: dict[str, Spec] = {f.name: _field_type(f, written=True) for f in MACHINE_FIELDS}
_POOLS_PER_NODE = Array(Table(PAGES, key=Size(), max_len=16), max_len=MAX_NODE_ID + 1)
# Machine.build's keywords.
BUILD_TYPES: dict[str, Spec] = {
    **{k: WRITTEN_TYPES[k] for k in ("page_size", "hugepage_sizes", "default_hugepage_size",
                                     "arch")},
    "nodes": Int(1, MAX_NODE_ID + 1),
    "mem_per_node": Size(),
    "hugepages": Table(PAGES, key=Size(), max_len=16),
    "hugepages_per_node": _POOLS_PER_NODE,
}  # fmt: skip
_BUILD_OPTIONAL = {"hugepages", "hugepages_per_node", "hugepage_sizes", "default_hugepage_size"}
# A scenario's [machine] keys (besides `dump`) and what each takes.
SCENARIO_MACHINE_TYPES: dict[str, Spec] = {
    **WRITTEN_TYPES,
    **BUILD_TYPES,
    "free_hugepages_per_node": _POOLS_PER_NODE,
}
assert set(SCENARIO_MACHINE_TYPES) == SCENARIO_MACHINE_KEYS


def _checked(spec: Spec, value: object, key: str) -> None:
    try:
        spec.check(value, key)
    except ValueTypeError as e:
        raise MachineError(str(e)) from None


_VERSION_RE = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")


def parse_kernel_version(release: str) -> tuple[int, int, int]:
    """(major, minor, patch) from a release string such as ``6.18.44-fc-v1045`` or ``3.10``."""
    m = _VERSION_RE.match(release.strip())
    if not m:
        raise MachineError(f"kernel_version: cannot read {release!r} (expected e.g. '5.15.0')")
    if any(len(p) > 5 or int(p) > 65535 for p in m.groups(default="0")):
        raise MachineError(f"kernel_version: {release[:40]!r} has a part beyond 65535")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)
