"""Every fixture machine loads, and what umbp-sim reads matches the files in the tarball.

The expected numbers were read from the tarballs with ``tar xOjf`` while writing this test
(proc/meminfo MemTotal/MemAvailable/Hugepagesize, nodeN/meminfo MemTotal,
nodeN/hugepages/hugepages-<N>kB/nr_hugepages, sys/kernel/mm/hugepages/*/nr_hugepages).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from umbp_sim.dump import load_dump, load_machine

DATA = Path(__file__).parent / "data" / "machines"
K, M, G = 1 << 10, 1 << 20, 1 << 30

# name -> expected facts (kB values as printed in the files, converted in the test)
FIXTURES = {
    "128arm-2pa2n8cluster4co": dict(
        arch="arm64",
        page_size=4 * K,
        mem_total_kb=527031224,
        mem_available_kb=478155232,
        default=2 * M,
        sizes=[64 * K, 2 * M, 32 * M, G],
        global_totals={},
        nodes={0: 131732940, 1: 132117940, 2: 132117936, 3: 131062408},
        node_pools={},
        kernel="5.15.0-rc1-00005-g4c1b4a4d90b6-dirty",
    ),
    "16amd64-4n4c-cgroup-distance-merge": dict(
        arch="x86_64",
        page_size=4 * K,
        mem_total_kb=33018776,
        mem_available_kb=None,
        default=2 * M,
        sizes=[2 * M],
        global_totals={2 * M: 2048},
        nodes={0: 8387892, 1: 8388608, 2: 8388608, 3: 8388608},
        node_pools={n: {2 * M: 512} for n in range(4)},
        kernel="3.13.0",
    ),
    "20s390-2g6s4c": dict(
        arch="s390x",
        page_size=4 * K,
        mem_total_kb=2053992,
        mem_available_kb=None,
        default=M,
        sizes=[M],
        global_totals={M: 0},
        nodes={},
        node_pools={},
        kernel="3.13.0",
    ),
    "2i386-2c-nohugepage": dict(
        arch="i386",
        page_size=4 * K,
        mem_total_kb=2075428,
        mem_available_kb=None,
        default=None,
        sizes=[],
        global_totals={},
        nodes={},
        node_pools={},
        kernel="3.13.0",
    ),
    "32intel64-2p8co2t+8ve": dict(
        arch="x86_64",
        page_size=4 * K,
        mem_total_kb=97445600,
        mem_available_kb=83337000,
        default=2 * M,
        sizes=[2 * M, G],
        global_totals={2 * M: 4096, G: 0},
        nodes={0: 47925628, 1: 49519964},
        node_pools={0: {2 * M: 2048, G: 0}, 1: {2 * M: 2048, G: 0}},
        kernel="3.10.0-1160.15.2.el7.x86_64",
    ),
    "40intel64-2g2n4c+pcilocality": dict(
        arch="x86_64",
        page_size=4 * K,
        mem_total_kb=529428392,
        mem_available_kb=None,
        default=2 * M,
        sizes=[2 * M],
        global_totals={2 * M: 0},
        nodes={0: 134204252, 1: 134217728, 2: 134217728, 3: 134217728},
        node_pools={n: {2 * M: 0} for n in range(4)},
        kernel="3.13.0",
    ),
    "64amd64-4s2n4ca2co": dict(
        arch="x86_64",
        page_size=4 * K,
        mem_total_kb=123994388,
        mem_available_kb=None,
        default=2 * M,
        sizes=[2 * M],
        global_totals={2 * M: 0},
        nodes={
            0: 16769836,
            1: 16777216,
            2: 16777216,
            3: 16777216,
            4: 16777216,
            5: 8388608,
            6: 16777216,
            7: 16760832,
        },
        node_pools={n: {2 * M: 0} for n in range(8)},
        kernel="3.13.0",
    ),
    "offline-cpu0-node0": dict(
        arch="x86_64",
        page_size=4 * K,
        mem_total_kb=131737080,
        mem_available_kb=115928384,
        default=2 * M,
        sizes=[2 * M, G],
        global_totals={2 * M: 0, G: 0},
        nodes={1: 67108864},
        node_pools={1: {2 * M: 0, G: 0}},
        kernel="4.15.0",
    ),
}


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_matches_its_files(name: str) -> None:
    exp = FIXTURES[name]
    machine, facts = load_dump(DATA / f"{name}.tar.bz2")
    assert machine.arch == exp["arch"]
    assert facts.page_size == machine.page_size == exp["page_size"]
    assert facts.mem_total == machine.mem_total == exp["mem_total_kb"] * 1024
    avail = exp["mem_available_kb"]
    assert facts.mem_available == (None if avail is None else avail * 1024)
    assert facts.default_hugepage_size == machine.default_hugepage_size == exp["default"]
    assert sorted(machine.hugepage_sizes) == exp["sizes"]
    assert machine.kernel_version == exp["kernel"]
    for size, total in exp["global_totals"].items():
        assert facts.hugepages[size].total == total
        assert machine.pool_total(size) == total  # node sums agree with the global count
    assert [n.id for n in facts.nodes] == sorted(exp["nodes"])
    for node in facts.nodes:
        assert node.mem_total == exp["nodes"][node.id] * 1024
        for size, total in exp["node_pools"].get(node.id, {}).items():
            assert node.hugepages[size].total == total
    machine.validate()


def test_arm64_all_four_sizes_read_per_node() -> None:
    m = load_machine(DATA / "128arm-2pa2n8cluster4co.tar.bz2")
    assert [sorted(n.hugepages) for n in m.nodes] == [[64 * K, 2 * M, 32 * M, G]] * 4
    assert m.nodes[2].distances == [32, 25, 10, 16]
    assert m.nodes[3].cpus == "96-127"


def test_offline_node_keeps_the_dumps_lists() -> None:
    m, f = load_dump(DATA / "offline-cpu0-node0.tar.bz2")
    assert f.possible_nodes == [0, 1] and f.online_nodes == [1] and f.has_memory == [0, 1]
    assert m.possible() == [0, 1] and m.online() == [1] and m.node_ids() == [1]


def test_no_node_directory_gives_one_node_with_the_global_pool() -> None:
    m, f = load_dump(DATA / "20s390-2g6s4c.tar.bz2")
    assert f.nodes == [] and not f.numa_sysfs and not m.numa_sysfs
    assert m.node_ids() == [0]
    assert m.nodes[0].mem_total == 2053992 * 1024
    assert m.nodes[0].mem_free == 1853820 * 1024
    assert "page size 4 KiB, s390x: proc/cpuinfo 'vendor_id : IBM/S390'" in f.notes


def test_kernel_without_hugetlb_has_no_sizes() -> None:
    m, f = load_dump(DATA / "2i386-2c-nohugepage.tar.bz2")
    assert m.hugepage_sizes == [] and m.default_hugepage_size is None
    assert f.hugepages == {}
    assert "no hugepage sizes: kernel without CONFIG_HUGETLB_PAGE" in f.notes
    assert (
        "page size 4 KiB, i386: proc/cpuinfo 'vendor_id : GenuineIntel', meminfo HighTotal "
        "1179296 kB (highmem: a 32-bit kernel)"
    ) in f.notes


def test_overcommit_ratio_solved_from_commit_limit() -> None:
    # 16amd64: (16436420 - 2024184) * 100 / (33018776 - 2048 * 2048) = 50 exactly
    m, f = load_dump(DATA / "16amd64-4n4c-cgroup-distance-merge.tar.bz2")
    assert m.overcommit_ratio == 50
    assert "overcommit_ratio 50: solved from CommitLimit" in f.notes
    assert m.swap_total == 2024184 * 1024 and m.committed_as == 206304 * 1024


def test_symlinks_in_fixture_are_not_followed_out() -> None:
    # 128arm has sys/bus/node/devices/nodeN symlinks; they are outside what the reader serves.
    _m, f = load_dump(DATA / "128arm-2pa2n8cluster4co.tar.bz2")
    assert not any("ignored" in n for n in f.notes)
