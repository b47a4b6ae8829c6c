"""SimKernel mbind: the errno table of docs/kernel-model.md section 3."""

from __future__ import annotations

import errno

import pytest

from umbp_sim import _native
from umbp_sim.machine import Machine, MiB
from umbp_sim.sim import SimHost

C = _native.constants
RW = C["PROT_READ"] | C["PROT_WRITE"]
PRIV = C["MAP_PRIVATE"] | C["MAP_ANONYMOUS"]
HUGE = PRIV | C["MAP_HUGETLB"]
BIND, PREF, DEFAULT, LOCAL = C["MPOL_BIND"], C["MPOL_PREFERRED"], C["MPOL_DEFAULT"], C["MPOL_LOCAL"]
H2 = 2 * MiB


@pytest.fixture
def one_node() -> tuple[SimHost, int]:
    h = SimHost(Machine.x86_64(hugepages={"2MiB": 4}))
    a = h.kernel.mmap(0, 1 * MiB, RW, PRIV)
    assert a.ok
    return h, a.value


@pytest.mark.parametrize(
    "mode,nodes,maxnode,flags,expect",
    [
        (BIND, [0], 2, 0, 0),
        (BIND, [0], 1, 0, errno.EINVAL),  # maxnode-1 bits: empty mask
        (BIND, None, 64, 0, errno.EINVAL),
        (BIND, [], 64, 0, errno.EINVAL),
        (BIND, [0], 0, 0, errno.EINVAL),  # --maxnode wraps
        (BIND, [0], 32769, 0, 0),
        (BIND, [0], 32770, 0, errno.EINVAL),
        (BIND, [0, 1024], 1026, 0, errno.EINVAL),
        (BIND, [0, 1024], 1025, 0, 0),  # bit 1024 not read
        (BIND, [1], 64, 0, errno.EINVAL),  # no memory there
        (BIND, [0, 1], 64, 0, 0),  # offline node dropped
        (BIND, [0, 1023], 1025, 0, 0),
        (BIND | C["MPOL_F_STATIC_NODES"], [0, 1], 64, 0, 0),
        (BIND | C["MPOL_F_STATIC_NODES"] | C["MPOL_F_RELATIVE_NODES"], [0], 64, 0, errno.EINVAL),
        (PREF, [1], 64, 0, errno.EINVAL),
        (PREF, None, 0, 0, 0),  # empty preferred = local
        (PREF, [0], 64, 0, 0),
        (DEFAULT, [0], 64, 0, errno.EINVAL),
        (DEFAULT, None, 0, 0, 0),
        (LOCAL, [0], 64, 0, errno.EINVAL),
        (LOCAL, None, 0, 0, 0),
        (C["MPOL_INTERLEAVE"], [0], 64, 0, 0),
        (99, [0], 64, 0, errno.EINVAL),
        (BIND, [0], 64, 0x80, errno.EINVAL),  # unknown flag
        (BIND, [0], 64, C["MPOL_MF_MOVE"] | C["MPOL_MF_STRICT"], 0),
        (BIND, [0], 64, C["MPOL_MF_MOVE_ALL"], 0),  # root
    ],
)
def test_errno_table(one_node: tuple[SimHost, int], mode, nodes, maxnode, flags, expect) -> None:  # type: ignore[no-untyped-def]
    h, a = one_node
    assert h.kernel.mbind(a, 1 * MiB, mode, nodes, maxnode, flags).error == expect


def test_unaligned_addr_zero_len_and_holes(one_node: tuple[SimHost, int]) -> None:
    h, a = one_node
    k = h.kernel
    assert k.mbind(a + 1, 4096, BIND, [0], 64).error == errno.EINVAL
    assert k.mbind(a, 0, BIND, [0], 64).ok
    assert k.mbind(a, 2 * MiB, BIND, [0], 64).error == errno.EFAULT  # runs past the mapping
    assert k.mbind(a, 2 * MiB, DEFAULT, None, 0).ok  # DISCONTIG_OK
    assert k.munmap(a, 1 * MiB).ok
    assert k.mbind(a, 4096, DEFAULT, None, 0).error == errno.EFAULT  # no VMA at all


def test_move_all_needs_privilege() -> None:
    h = SimHost(Machine.x86_64())
    cfg_root = h.kernel  # root by default
    a = cfg_root.mmap(0, 4096, RW, PRIV).value
    assert cfg_root.mbind(a, 4096, BIND, [0], 64, C["MPOL_MF_MOVE_ALL"]).ok
    from umbp_sim.sim import to_sim_config

    cfg = to_sim_config(Machine.x86_64())
    cfg.root = False
    k = _native.SimKernel(cfg)
    a = k.mmap(0, 4096, RW, PRIV).value
    assert k.mbind(a, 4096, BIND, [0], 64, C["MPOL_MF_MOVE_ALL"]).error == errno.EPERM
    assert k.mbind(a, 4096, BIND, [0], 64, C["MPOL_MF_MOVE"]).ok


def test_hugetlb_split_rule() -> None:
    h = SimHost(Machine.build(nodes=2, hugepages={"2MiB": 8}))
    k = h.kernel
    a = k.mmap(0, 4 * H2, RW, HUGE).value
    assert k.mbind(a, 4096, BIND, [0], 64).error == errno.EINVAL
    assert k.mbind(a + 4096, H2, BIND, [0], 64).error == errno.EINVAL
    assert k.mbind(a, H2, BIND, [1], 64).ok
    assert k.mbind(a, 4096, BIND, [1], 64).ok  # identical policy: no split needed
    assert [(m.length, m.policy_nodes) for m in h.mappings()] == [(H2, (1,)), (3 * H2, ())]


def test_version_gated_modes() -> None:
    h = SimHost(Machine.x86_64(kernel_version="5.10.0"))
    a = h.kernel.mmap(0, 4096, RW, PRIV).value
    assert h.kernel.mbind(a, 4096, 5, [0], 64).error == errno.EINVAL  # PREFERRED_MANY 5.15
    h = SimHost(Machine.x86_64(kernel_version="3.2.0"))
    a = h.kernel.mmap(0, 4096, RW, PRIV).value
    assert h.kernel.mbind(a, 4096, LOCAL, None, 0).error == errno.EINVAL  # MPOL_LOCAL 3.8


def test_interleave_spreads_faults() -> None:
    h = SimHost(Machine.build(nodes=2, hugepages={"2MiB": 8}))
    k = h.kernel
    a = k.mmap(0, 4 * H2, RW, HUGE).value
    assert k.mbind(a, 4 * H2, C["MPOL_INTERLEAVE"], [0, 1], 64).ok
    assert k.madvise(a, 4 * H2, C["MADV_POPULATE_WRITE"]).ok
    assert h.node_hugepages(0).free == 2 and h.node_hugepages(1).free == 2


def test_preferred_falls_back() -> None:
    h = SimHost(Machine.build(nodes=2, hugepages_per_node=[{"2MiB": 4}, {"2MiB": 1}]))
    k = h.kernel
    a = k.mmap(0, 3 * H2, RW, HUGE).value
    assert k.mbind(a, 3 * H2, PREF, [1], 64).ok
    assert k.madvise(a, 3 * H2, C["MADV_POPULATE_WRITE"]).ok
    assert h.node_hugepages(1).free == 0 and h.node_hugepages(0).free == 2
