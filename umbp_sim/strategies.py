"""Hypothesis strategies for umbp-sim: simulated hosts, fault plans and allocation requests.

Public and usable from other projects' tests::

    from hypothesis import given
    from umbp_sim import simulate
    from umbp_sim.strategies import alloc_requests, fault_plans, machines

    @given(machines(nodes=2, kernel_version="6.18.0"), alloc_requests())
    def test_something(machine, req):
        with simulate(machine) as host:
            ...

``machines(**pins)``
    Valid ``umbp_sim.Machine`` objects (every one passes ``validate()`` and renders: the SimHost
    built from it has a non-empty ``files()``). Drawn: ``preset`` (``"x86_64"``, ``"arm64-4k"``,
    ``"arm64-16k"``, ``"arm64-64k"``, ``"ppc64le-radix"``, ``"ppc64le-hash"``: page size and
    hugepage sizes, docs/kernel-model.md section 8),
    ``nodes`` (1-4), ``mem_per_node``, ``hugepages_per_node`` (one ``{size: pages}`` dict per node),
    ``nr_overcommit_hugepages`` (``{size: pages}``), ``overcommit_memory`` (0/1/2),
    ``hugepages_reserved`` (pages other processes hold, at most the pool), ``overcommit_ratio``,
    ``rlimit_as``, ``memcg_max``, ``kernel_version`` (from
    ``KERNEL_VERSIONS``, 3.10 .. 6.18 with the 4.14 / 5.14 feature boundaries on both sides).
    ``max_pool_pages`` (default 8; 2 for sizes of 1 GiB and more) caps each drawn pool.
    Every keyword pins that field: a plain value, or a strategy to draw it from
    (``machines(nodes=2, kernel_version="6.18.0")``, ``machines(nodes=st.integers(2, 4))``).
    Any other Machine field (``umbp_sim.machine.MACHINE_FIELDS``) but those the preset decides
    can be pinned too (``machines(admin_reserve_kbytes=0)``); unpinned, it keeps its default.
    Shrinks toward a plain host: one x86_64 node, no pools, no overcommit, no limits, 6.18.

``fault_plans(ops=OPS, max_rules=3, seed=None)``
    ``umbp_sim.faults.FaultPlan`` objects of 0..max_rules rules (operations, errnos, schedules,
    argument filters) that validate and round-trip through ``to_toml``/``from_toml``. Fatal
    answers (signals, ``throw``) are drawn only with ``fatal=True``.

``alloc_requests(hugepage_sizes=None, nodes=None, max_size=64 MiB)``
    ``AllocRequest(size, backing, hugepage_size, numa_node, prefault)``; ``backing`` is the name
    of a ``UMBPHostBufferBacking`` value. ``req.args()`` gives the positional arguments of
    ``UMBPHostMemAllocator.alloc``; ``req.table()`` a scenario ``[request]``/step table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

from umbp_sim.faults import OPS, FaultPlan, FaultRule
from umbp_sim.machine import (
    BUILD_KEYWORDS,
    MACHINE_FIELDS,
    GiB,
    KiB,
    Machine,
    MiB,
    default_hugepage_sizes,
)
from umbp_sim.request import AllocRequest
from umbp_sim.vocabulary.backing import BACKINGS

__all__ = [
    "BACKINGS",
    "KERNEL_VERSIONS",
    "PRESETS",
    "AllocRequest",
    "alloc_requests",
    "fault_plans",
    "machines",
]

# The first entry of each list is the simplest: shrinking moves toward it.
PRESETS: dict[str, tuple[str, int]] = {
    "x86_64": ("x86_64", 4 * KiB),
    "arm64-4k": ("arm64", 4 * KiB),
    "arm64-16k": ("arm64", 16 * KiB),
    "arm64-64k": ("arm64", 64 * KiB),
    "ppc64le-radix": ("ppc64le", 64 * KiB),
    "ppc64le-hash": ("ppc64le", 64 * KiB),
}
PRESET_MMU = {"ppc64le-radix": "radix", "ppc64le-hash": "hash"}  # ppc64's sizes follow its MMU
KERNEL_VERSIONS = (
    "6.18.0", "6.8.0", "6.1.0", "5.15.0", "5.14.0", "5.13.0", "5.10.0", "5.4.0",
    "4.18.0", "4.14.0", "4.13.0", "4.9.0", "3.17.0", "3.16.0", "3.10.0",
)  # fmt: skip
MEM_PER_NODE = (16 * GiB, 4 * GiB, 64 * GiB, 256 * GiB)

# What machines() draws itself, besides the preset; a pin replaces the draw.
_DRAWN = {
    "nodes", "mem_per_node", "hugepages_per_node", "nr_overcommit_hugepages", "overcommit_memory",
    "overcommit_ratio", "rlimit_as", "memcg_max", "kernel_version", "hugepages_reserved",
}  # fmt: skip
# The preset decides these (a pin would contradict it).
_BY_PRESET = {"arch", "page_size", "hugepage_sizes", "default_hugepage_size", "hugepages"}
# Keywords machines() takes: Machine.build's and every Machine field as declared (machine.py;
# ``nodes`` is the node count, as in a scenario's [machine]) but the preset's, the preset, and
# the pool cap. A field it does not draw keeps its default unless pinned.
_MACHINE_PINS = ((BUILD_KEYWORDS | {f.name for f in MACHINE_FIELDS}) - _BY_PRESET) | {
    "preset",
    "max_pool_pages",
}


def _pinned(pins: dict[str, Any], key: str, default: st.SearchStrategy[Any]) -> Any:
    if key not in pins:
        return default
    value = pins[key]
    return value if isinstance(value, st.SearchStrategy) else st.just(value)


def _max_pages(size: int, cap: int) -> int:
    # Keep pools of gigantic pages small: 2 x 16 GiB is already a lot of simulated memory.
    return min(cap, 2) if size >= GiB else cap


@st.composite
def _machine(draw: st.DrawFn, pins: dict[str, Any]) -> Machine:
    preset = draw(_pinned(pins, "preset", st.sampled_from(list(PRESETS))))
    arch, page = PRESETS[preset]
    mmu = PRESET_MMU.get(preset, "radix")
    # 2 MiB first: every preset but ppc64le-hash has it, so a pool drawn on arm64 keeps its
    # place in the choice sequence when the preset shrinks to x86_64.
    sizes = sorted(default_hugepage_sizes(arch, page, mmu), key=lambda s: (s != 2 * MiB, s))
    nodes = draw(_pinned(pins, "nodes", st.integers(1, 4)))
    mem = draw(_pinned(pins, "mem_per_node", st.sampled_from(MEM_PER_NODE)))
    cap = draw(_pinned(pins, "max_pool_pages", st.just(8)))
    pool_st = st.fixed_dictionaries(
        {}, optional={s: st.integers(0, _max_pages(s, cap)) for s in sizes}
    )
    per_node = draw(
        _pinned(pins, "hugepages_per_node", st.lists(pool_st, min_size=nodes, max_size=nodes))
    )
    over = draw(
        _pinned(
            pins,
            "nr_overcommit_hugepages",
            st.fixed_dictionaries({}, optional={s: st.integers(0, 4) for s in sizes}),
        )
    )
    kw: dict[str, Any] = {
        "overcommit_memory": draw(_pinned(pins, "overcommit_memory", st.sampled_from([0, 1, 2]))),
        "overcommit_ratio": draw(_pinned(pins, "overcommit_ratio", st.sampled_from([50, 100]))),
        "rlimit_as": draw(
            _pinned(pins, "rlimit_as", st.one_of(st.none(), st.sampled_from([GiB, 64 * GiB])))
        ),
        "memcg_max": draw(
            _pinned(pins, "memcg_max", st.one_of(st.none(), st.sampled_from([GiB, 32 * GiB])))
        ),
        "kernel_version": draw(_pinned(pins, "kernel_version", st.sampled_from(KERNEL_VERSIONS))),
    }
    if over:
        kw["nr_overcommit_hugepages"] = {s: n for s, n in over.items() if n}
    # Pages other processes have reserved already (a busy host): at most the free pages.
    pools = {s: sum(p.get(s, 0) for p in per_node) for s in sizes}
    resv = draw(
        _pinned(
            pins,
            "hugepages_reserved",
            st.fixed_dictionaries(
                {}, optional={s: st.integers(0, n) for s, n in pools.items() if n}
            ),
        )
    )
    if any(resv.values()):
        kw["hugepages_reserved"] = {s: n for s, n in resv.items() if n}
    for key in sorted((_MACHINE_PINS - _DRAWN - {"preset", "max_pool_pages"}) & pins.keys()):
        kw[key] = draw(_pinned(pins, key, st.nothing()))
    builds: dict[str, Callable[..., Machine]] = {
        "x86_64": Machine.x86_64, "arm64": Machine.arm64, "ppc64le": Machine.ppc64le
    }  # fmt: skip
    build = builds[arch]
    extra: dict[str, Any] = {"page_size": page} if arch == "arm64" else {}
    if arch == "ppc64le":
        extra["mmu"] = mmu
    return build(
        nodes=nodes,
        mem_per_node=mem,
        hugepages_per_node=[{s: n for s, n in p.items() if n} for p in per_node],
        **extra,
        **kw,
    )


def machines(**pins: Any) -> st.SearchStrategy[Machine]:
    """Valid simulated hosts; keywords pin fields (a value or a strategy). See the module doc.

    >>> from hypothesis import given, settings
    >>> @settings(max_examples=10, database=None, derandomize=True)
    ... @given(machines(nodes=2, kernel_version="5.10.0"))
    ... def check(machine):
    ...     assert machine.node_ids() == [0, 1] and machine.kernel_version == "5.10.0"
    >>> check()
    """
    unknown = set(pins) - _MACHINE_PINS
    if unknown:
        raise TypeError(
            f"machines(): unknown keyword(s) {sorted(unknown)} (known: {sorted(_MACHINE_PINS)})"
        )
    if "preset" in pins and not isinstance(pins["preset"], st.SearchStrategy):
        if pins["preset"] not in PRESETS:
            raise ValueError(
                f"machines(preset=...): one of {list(PRESETS)}, not {pins['preset']!r}"
            )
    return _machine(pins)


# ---- fault plans ---------------------------------------------------------------------------
_ERRNOS: dict[str, tuple[str, ...]] = {
    "mmap": ("ENOMEM", "EINVAL", "EAGAIN", "EPERM"),
    "munmap": ("EINVAL", "ENOMEM"),
    "madvise": ("ENOMEM", "EFAULT", "EINVAL", "EINTR", "EHWPOISON"),
    "mbind": ("EINVAL", "EFAULT", "EPERM", "EIO", "ENOMEM"),
    "memfd_create": ("EMFILE", "ENFILE", "EINVAL", "ENODEV", "ENOSYS", "ENOMEM"),
    "ftruncate": ("EINVAL", "EFBIG", "ENOMEM", "EINTR"),
    "close": ("EINTR", "EIO", "EBADF"),
    "read_file": ("ENOENT", "EACCES", "EIO"),
    "touch": ("EFAULT", "ENOMEM"),
}
_FILTERS: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "mmap": {
        "flags_has": st.sampled_from(["MAP_HUGETLB", "MAP_SHARED", "MAP_PRIVATE|MAP_ANONYMOUS"]),
        "min_length": st.sampled_from([4 * KiB, 2 * MiB, GiB]),
    },
    "munmap": {"max_length": st.sampled_from([4 * KiB, 2 * MiB, 64 * MiB])},
    "madvise": {"advice": st.just("MADV_POPULATE_WRITE")},
    "mbind": {"mode": st.just("MPOL_BIND"), "node": st.integers(0, 3)},
    "memfd_create": {"memfd_flags_has": st.sampled_from(["MFD_HUGETLB", "MFD_CLOEXEC"])},
    "ftruncate": {"min_length": st.sampled_from([4 * KiB, 2 * MiB])},
    "read_file": {
        "path": st.sampled_from(
            ["/sys/devices/system/node/possible", "/proc/meminfo", "/sys/kernel/mm/hugepages/*"]
        )
    },
    "touch": {},
    "close": {},
}
_SCHEDULES: st.SearchStrategy[dict[str, Any]] = st.one_of(
    st.just({}),
    st.builds(lambda n: {"nth": n}, st.integers(1, 5)),
    st.builds(lambda a, k: {"calls": (a, a + k)}, st.integers(1, 4), st.integers(0, 3)),
    st.builds(lambda n: {"every": n}, st.integers(1, 5)),
    st.builds(lambda n: {"first": n}, st.integers(0, 3)),
)


@st.composite
def _rule(draw: st.DrawFn, ops: tuple[str, ...], fatal: bool) -> FaultRule:
    op = draw(st.sampled_from(ops))
    kw: dict[str, Any] = {"op": op}
    answers = ["errno"]
    if op == "read_file":
        answers.append("content")
    if fatal:
        answers.append("throw")
        if op != "read_file":
            answers.append("signal")
    answer = draw(st.sampled_from(answers))
    if answer == "errno":
        kw["errno"] = draw(st.sampled_from(_ERRNOS[op]))
    elif answer == "content":
        kw["content"] = draw(st.sampled_from(["", "garbage\n", "0-3\n"]))
    elif answer == "throw":
        kw["throw"] = "bad_alloc"
    else:
        kw["signal"] = draw(st.sampled_from(["SIGBUS", "SIGKILL", "SIGSEGV"]))
    kw.update(draw(_SCHEDULES))
    if draw(st.booleans()):
        kw["probability"] = draw(st.sampled_from([0.5, 0.1, 1.0]))
    if draw(st.booleans()):
        kw["max_fires"] = draw(st.integers(1, 3))
    filters = _FILTERS[op]
    if filters:
        chosen = draw(st.lists(st.sampled_from(sorted(filters)), max_size=2, unique=True))
        for key in chosen:
            value = draw(filters[key])
            if key in ("flags_has", "memfd_flags_has"):
                value = tuple(value.split("|"))
            kw[key] = value
    return FaultRule(**kw)


def fault_plans(
    ops: tuple[str, ...] | list[str] = OPS,
    max_rules: int = 3,
    seed: int | None = None,
    fatal: bool = False,
) -> st.SearchStrategy[FaultPlan]:
    """Fault plans over ``ops`` with 0..max_rules rules; shrinks toward the empty plan.

    >>> from hypothesis import given, settings
    >>> @settings(max_examples=10, database=None, derandomize=True)
    ... @given(fault_plans(ops=["mmap", "madvise"], max_rules=2, seed=7))
    ... def check(plan):
    ...     assert plan.seed == 7 and len(plan.rules) <= 2
    ...     assert all(rule.op in ("mmap", "madvise") for rule in plan.rules)
    ...     assert FaultPlan.from_toml(plan.to_toml()) == plan
    >>> check()
    """
    ops = tuple(ops)
    bad = [o for o in ops if o not in OPS]
    if bad or not ops:
        raise ValueError(f"fault_plans(ops=...): unknown operation(s) {bad} (known: {OPS})")
    seeds = st.just(seed) if seed is not None else st.integers(0, 2**32)
    return st.builds(
        lambda rules, s: FaultPlan(tuple(rules), s),
        st.lists(_rule(ops, fatal), max_size=max_rules),
        seeds,
    )


# ---- allocation requests -------------------------------------------------------------------
_ODD_HUGEPAGE_SIZES = (3 * MiB, 4 * KiB, 0)  # not a power of two / not above the base page


def alloc_requests(
    hugepage_sizes: list[int] | tuple[int, ...] | None = None,
    nodes: int | None = None,
    max_size: int = 64 * MiB,
) -> st.SearchStrategy[AllocRequest]:
    """Allocation requests. ``hugepage_sizes``: the sizes to favour (a host's); odd sizes (not a
    power of two, not above the base page, not configured) are drawn too. ``nodes``: the host's
    node count; numa_node is then -1, one of its nodes, or one outside it.

    >>> from hypothesis import given, settings
    >>> from umbp_sim import Machine, UMBPHostMemAllocator, simulate
    >>> @settings(max_examples=10, database=None, derandomize=True)
    ... @given(alloc_requests(nodes=1, max_size=1 << 20))
    ... def check(req):
    ...     with simulate(Machine.x86_64(hugepages={"2MiB": 4})):
    ...         alloc = UMBPHostMemAllocator()
    ...         handle = alloc.alloc(*req.args())
    ...         if handle:
    ...             alloc.free(handle)
    >>> check()
    """
    sizes = list(hugepage_sizes) if hugepage_sizes else [2 * MiB, GiB]
    hp = st.one_of(st.sampled_from(sizes), st.sampled_from(_ODD_HUGEPAGE_SIZES + (64 * KiB,)))
    n = nodes if nodes is not None else 2
    numa = st.one_of(st.just(-1), st.integers(0, n - 1), st.sampled_from([n, 1023, 5000]))
    size = st.one_of(
        st.integers(1, 3 * MiB),
        st.sampled_from([4 * KiB, 2 * MiB, 2 * MiB + 1, 16 * MiB]),
        st.integers(1, max_size),
    )
    return st.builds(
        AllocRequest,
        size=size,
        backing=st.sampled_from(BACKINGS),
        hugepage_size=hp,
        numa_node=numa,
        prefault=st.booleans(),
    )
