"""Rendered /proc and /sys files (docs/kernel-model.md section 7) and the sim_host fixture."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from umbp_sim import _context, _native
from umbp_sim.machine import GiB, HugePool, Machine, MiB, Node
from umbp_sim.sim import HugePages, SimHost, simulate

C = _native.constants
RW = C["PROT_READ"] | C["PROT_WRITE"]
HUGE = C["MAP_PRIVATE"] | C["MAP_ANONYMOUS"] | C["MAP_HUGETLB"]
H2 = 2 * MiB


def test_meminfo_layout_is_byte_exact() -> None:
    h = SimHost(Machine.x86_64(hugepages={"2MiB": 4}, mem_per_node="24683584KiB"))
    a = h.kernel.mmap(0, 3 * H2, RW, HUGE).value
    assert h.kernel.touch(a, 1, 1).ok
    text = h.read("/proc/meminfo")
    lines = text.splitlines(keepends=True)
    assert lines[0] == "MemTotal:       24683584 kB\n"
    assert lines[2].startswith("MemAvailable:   ")
    tail = text[text.index("HugePages_Total") :]
    assert tail == (
        "HugePages_Total:       4\n"
        "HugePages_Free:        3\n"
        "HugePages_Rsvd:        2\n"
        "HugePages_Surp:        0\n"
        "Hugepagesize:       2048 kB\n"
        "Hugetlb:            8192 kB\n"
    )
    for line in lines:
        if not line.startswith("HugePages_"):
            assert line.endswith(" kB\n") and len(line.split(":")[0]) < 16
            assert line[16:].rstrip(" kB\n").strip().isdigit()
    assert "CommitLimit:    " in text and "Committed_AS:   " in text


def test_meminfo_version_gated_lines() -> None:
    old = SimHost(Machine.x86_64(kernel_version="3.10.0")).read("/proc/meminfo")
    assert "MemAvailable" not in old and "Hugetlb:" not in old and "HugePages_Total" in old
    assert "Hugetlb:" not in SimHost(Machine.x86_64(kernel_version="4.15.0")).read("/proc/meminfo")


def test_hugetlb_line_sums_all_sizes_others_show_default_only() -> None:
    h = SimHost(Machine.x86_64(hugepages={"2MiB": 2, "1GiB": 1}))
    m = h.meminfo()
    assert m["HugePages_Total"] == 2 and m["Hugetlb"] == (2 * H2 + GiB) // 1024


def test_sysfs_files() -> None:
    m = Machine.build(
        nodes=3,
        hugepages={"2MiB": 5},
        online_nodes=[0, 2, 3],
        possible_nodes=[0, 1, 2, 3],
        nr_overcommit_hugepages={"2MiB": 7},
    )
    m.nodes[2].id = 3
    m.nodes[1].id = 2
    m.nodes[1].mem_total = 0
    m.nodes[1].hugepages = {}
    h = SimHost(m)
    f = h.files()
    base = "/sys/kernel/mm/hugepages/hugepages-2048kB/"
    assert f[base + "nr_hugepages"] == "3\n"  # node 2 lost its pages above
    assert f[base + "nr_overcommit_hugepages"] == "7\n"
    assert f[base + "resv_hugepages"] == "0\n"
    assert f["/sys/kernel/mm/hugepages/hugepages-1048576kB/demote_size"] == "2048kB\n"
    assert f["/sys/devices/system/node/online"] == "0,2-3\n"
    assert f["/sys/devices/system/node/possible"] == "0-3\n"
    assert f["/sys/devices/system/node/has_memory"] == "0,3\n"
    assert f["/proc/sys/vm/nr_overcommit_hugepages"] == "7\n"
    assert f["/proc/sys/kernel/osrelease"] == "6.18.0\n"
    assert f["/sys/devices/system/node/node0/distance"] == "10 20 20\n"
    node = f["/sys/devices/system/node/node3/meminfo"]
    assert node.startswith("Node 3 MemTotal:       16777216 kB\nNode 3 MemFree:        ")
    assert node.endswith(
        "Node 3 HugePages_Total:     1\n"
        "Node 3 HugePages_Free:      1\n"
        "Node 3 HugePages_Surp:      0\n"
    )
    # The process's credentials (Machine.root): uid 0 with CAP_SYS_ADMIN (bit 21) in CapEff.
    status = dict(ln.split(":\t", 1) for ln in h.read("/proc/self/status").splitlines())
    assert status["Uid"] == "0\t0\t0\t0" and int(status["CapEff"], 16) >> 21 & 1
    with pytest.raises(OSError) as e:
        h.read("/proc/self/environ")
    assert e.value.errno == errno.ENOENT


def test_admin_knobs() -> None:
    h = SimHost(Machine.build(nodes=2, hugepages={"2MiB": 0}))
    h.set_nr_hugepages(H2, 5)
    assert h.node_hugepages(0).total == 3 and h.node_hugepages(1).total == 2
    h.set_nr_hugepages(H2, 4, node=1)
    assert h.hugepages() == HugePages(7, 7, 0, 0)
    assert h.read("/proc/sys/vm/nr_hugepages") == "7\n"
    h.set_nr_overcommit_hugepages(H2, 3)
    assert h.read("/proc/sys/vm/nr_overcommit_hugepages") == "3\n"
    with pytest.raises(OSError):
        h.set_nr_overcommit_hugepages(GiB, 1)  # gigantic pages cannot be surplus on 6.18


def test_render_to_directory(tmp_path: Path) -> None:
    h = SimHost(Machine.x86_64(hugepages={"2MiB": 4}))
    written = h.render(tmp_path)
    assert (tmp_path / "proc/meminfo").read_text() == h.read("/proc/meminfo")
    assert len(written) == len(h.files())


def test_simulate_pushes_and_pops_the_kernel() -> None:
    assert _context.current_kernel() is None
    with simulate(Machine.x86_64()) as host:
        assert _context.current_kernel() is host.kernel
    assert _context.current_kernel() is None


def test_machine_conversion_keeps_dump_state() -> None:
    m = Machine(
        nodes=[Node(0, 8 * GiB, mem_free=6 * GiB, hugepages={H2: HugePool(10, free=6, surplus=1)})],
        hugepages_reserved={H2: 2},
        committed_as=5 * GiB,
    )
    h = SimHost(m)
    assert h.hugepages() == HugePages(10, 6, 2, 1)
    assert h.meminfo()["Committed_AS"] == 5 * GiB // 1024
    assert h.meminfo()["MemFree"] == 6 * GiB // 1024


def test_sim_host_default_fixture_reads_live(sim_host: SimHost) -> None:
    with open("/proc/meminfo") as f:
        assert "HugePages_Total:     512\n" in f.read()
    a = sim_host.kernel.mmap(0, 3 * H2, RW, HUGE)
    assert a.ok
    with open("/sys/kernel/mm/hugepages/hugepages-2048kB/resv_hugepages") as f:
        assert f.read() == "3\n"
    sim_host.set_nr_hugepages(H2, 600)
    assert Path("/proc/sys/vm/nr_hugepages").read_text() == "600\n"
    assert _context.current_kernel() is sim_host.kernel


@pytest.mark.machine(nodes=2, hugepages={"1GiB": 4})
def test_sim_host_marker(sim_host: SimHost) -> None:
    text = Path("/sys/devices/system/node/node1/hugepages/hugepages-1048576kB/nr_hugepages")
    assert text.read_text() == "2\n"
    assert Path("/sys/devices/system/node/online").read_text() == "0-1\n"


@pytest.mark.parametrize(
    "sim_host",
    [Machine.arm64(page_size="64KiB"), Machine.x86_64(kernel_version="5.4.0")],
    indirect=True,
)
def test_sim_host_indirect(sim_host: SimHost) -> None:
    text = Path("/proc/meminfo").read_text()
    if sim_host.machine.arch == "arm64":
        assert "Hugepagesize:     524288 kB\n" in text
        assert sim_host.kernel.page_size() == 65536
    else:
        assert Path("/proc/sys/kernel/osrelease").read_text() == "5.4.0\n"
