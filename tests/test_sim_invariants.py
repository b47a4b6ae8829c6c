"""Random operation sequences on a SimKernel (hypothesis): the pool counters stay consistent
after every call, and once every mapping and fd is gone the host is back where it started."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings, strategies as st

from umbp_sim import _native
from umbp_sim.machine import Machine, MiB
from umbp_sim.sim import SimHost

C = _native.constants
RW = C["PROT_READ"] | C["PROT_WRITE"]
PRIV = C["MAP_PRIVATE"] | C["MAP_ANONYMOUS"]
H2 = 2 * MiB
FLAGS = [
    PRIV | C["MAP_HUGETLB"],
    PRIV | C["MAP_HUGETLB"] | C["MAP_NORESERVE"],
    C["MAP_SHARED"] | C["MAP_ANONYMOUS"] | C["MAP_HUGETLB"],
    PRIV,
]

op = st.one_of(
    st.tuples(st.just("mmap"), st.integers(1, 6), st.sampled_from(FLAGS)),
    st.tuples(st.just("memfd"), st.integers(1, 4), st.booleans()),
    st.tuples(st.just("populate"), st.integers(0, 20), st.integers(0, 5), st.integers(1, 6)),
    st.tuples(st.just("dontneed"), st.integers(0, 20), st.integers(0, 5), st.integers(1, 6)),
    st.tuples(st.just("munmap"), st.integers(0, 20), st.integers(0, 5), st.integers(1, 6)),
    st.tuples(
        st.just("mbind"),
        st.integers(0, 20),
        st.integers(0, 5),
        st.integers(1, 6),
        st.sampled_from([[0], [1], [0, 1]]),
    ),
    st.tuples(st.just("admin"), st.integers(0, 12)),
    st.tuples(st.just("close"), st.integers(0, 20)),
)


def check(h: SimHost) -> None:
    g = h.hugepages()
    assert 0 <= g.free <= g.total and 0 <= g.reserved <= g.free and 0 <= g.surplus <= g.total
    nodes = [h.node_hugepages(n) for n in (0, 1)]
    assert sum(n.total for n in nodes) == g.total
    assert sum(n.free for n in nodes) == g.free
    assert sum(n.surplus for n in nodes) == g.surplus
    for n in nodes:
        assert 0 <= n.free <= n.total and 0 <= n.surplus <= n.total


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, max_size=25))
def test_counters_consistent_and_restored(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    m = Machine.build(nodes=2, hugepages={"2MiB": 6}, nr_overcommit_hugepages={"2MiB": 3})
    h = SimHost(m)
    k = h.kernel
    maps: list[tuple[int, int]] = []
    fds: list[int] = []
    for o in ops:
        kind = o[0]
        if kind == "mmap":
            r = k.mmap(0, o[1] * H2, RW, o[2])
            if r.ok:
                maps.append((r.value, o[1] * H2))
        elif kind == "memfd":
            fd = k.memfd_create("f", C["MFD_HUGETLB"]).value
            assert k.ftruncate(fd, o[1] * H2).ok
            fds.append(fd)
            if o[2]:
                r = k.mmap(0, o[1] * H2, RW, C["MAP_SHARED"], fd, 0)
                if r.ok:
                    maps.append((r.value, o[1] * H2))
        elif kind in ("populate", "dontneed", "munmap", "mbind") and maps:
            base, length = maps[o[1] % len(maps)]
            start = base + min(o[2] * H2, length - H2)
            size = min(o[3] * H2, base + length - start)
            if kind == "populate":
                r = k.madvise(start, size, C["MADV_POPULATE_WRITE"])
            elif kind == "dontneed":
                r = k.madvise(start, size, C["MADV_DONTNEED"])
            elif kind == "mbind":
                r = k.mbind(start, size, C["MPOL_BIND"], o[4], 64)
            else:
                r = k.munmap(start, size)
            assert r.signal == 0
        elif kind == "admin":
            h.set_nr_hugepages(H2, o[1])
        elif kind == "close" and fds:
            assert k.close(fds.pop(o[1] % len(fds))).ok
        check(h)
    for m in h.mappings():  # what is still mapped (addresses of unmapped ranges get reused)
        assert k.munmap(m.start, m.length).ok
    for fd in fds:
        assert k.close(fd).ok
    check(h)
    g = h.hugepages()
    assert (g.reserved, g.free) == (0, g.total)
    if not any(o[0] == "admin" for o in ops):
        assert g.surplus == 0
    # else free surplus pages may stay, as on Linux: test_shrunk_pool_can_keep_a_free_surplus_page
    assert h.mappings() == [] and h.open_fds() == []
    assert h.meminfo()["Committed_AS"] == 0


def test_shrunk_pool_can_keep_a_free_surplus_page() -> None:
    # Linux (mm/hugetlb.c), found by the property above: a pool shrunk below what is in use and
    # reserved keeps a free surplus page once every mapping is gone.
    m = Machine.build(nodes=2, hugepages={"2MiB": 6}, nr_overcommit_hugepages={"2MiB": 3})
    h = SimHost(m)
    k = h.kernel
    flags = FLAGS[0]
    maps = [k.mmap(0, n * H2, RW, flags).value for n in (4, 1, 2)]

    def pool() -> tuple[int, int, int, int]:
        g = h.hugepages()
        return g.total, g.free, g.reserved, g.surplus

    assert pool() == (7, 7, 7, 1)  # gather_surplus_pages: one surplus page for the third mmap
    assert k.madvise(maps[0], 4 * H2, C["MADV_POPULATE_WRITE"]).ok
    # return_unused_surplus_pages frees surplus pages only from nodes with both surplus and free
    # pages: the surplus page's node has none free, so releasing a reserved page frees nothing.
    assert k.munmap(maps[1], H2).ok
    assert pool() == (7, 3, 2, 1)
    # set_max_huge_pages(0): min_count = resv + in use = 6 = the persistent pages, so nothing is
    # freed, and adjust_pool_surplus turns all 7 into surplus.
    h.set_nr_hugepages(H2, 0)
    assert pool() == (7, 3, 2, 7)
    assert k.munmap(maps[0], 4 * H2).ok  # free_huge_page: a surplus node's page goes to buddy
    assert pool() == (3, 3, 2, 3)
    # Releasing 2 reserved pages frees min(2, surplus) surplus pages: one free surplus page stays.
    assert k.munmap(maps[2], 2 * H2).ok
    assert pool() == (1, 1, 0, 1)
    assert h.mappings() == []
