"""Dumps without proc/meminfo (issue 19): the machine is built from nodeN/meminfo.

Every fixture is re-packed without its proc/meminfo; the figures must be the node files' (the
expected per-node numbers are test_dump_fixtures.py's, read from the tarballs), MemTotal their
sum, and every /proc/meminfo figure that is missing a note. Generated dumps (hypothesis) check
the sums on shapes the fixtures do not have (nodes without meminfo, without hugepage lines).
"""

from __future__ import annotations

import functools
import io
import tarfile
from pathlib import Path

import pytest
from fake_dumps import tar_bytes
from hypothesis import given, settings, strategies as st
from test_dump_fixtures import DATA, FIXTURES, G, K, M

from umbp_sim.dump import DumpError, load_dump, parse_meminfo
from umbp_sim.dump.hwloc import MISSING_FIGURES
from umbp_sim.dump.source import relevant

NOT_A_DUMP = (
    "not a machine dump: no proc/meminfo nor sys/devices/system/node/nodeN/meminfo inside "
    "(at its top or under one NAME/)"
)


@functools.cache
def without_proc_meminfo(name: str, mode: str = "w:xz") -> bytes:
    """The fixture tarball re-packed (in memory) without its proc/meminfo; only the members
    the reader may ask for are copied (the CPU and PCI trees would only cost time)."""
    buf = io.BytesIO()
    with tarfile.open(DATA / f"{name}.tar.bz2") as src, tarfile.open(fileobj=buf, mode=mode) as out:
        for m in src.getmembers():
            rel = m.name.partition("/")[2]
            if m.isfile() and relevant(rel) and rel != "proc/meminfo":
                out.addfile(m, src.extractfile(m))
    return buf.getvalue()


def node_meminfo_values(name: str) -> dict[int, dict[str, int]]:
    """{node: {key: kB or count}} straight from the fixture's nodeN/meminfo files."""
    out: dict[int, dict[str, int]] = {}
    with tarfile.open(DATA / f"{name}.tar.bz2") as tar:
        for m in tar.getmembers():
            parts = m.name.split("/")
            if m.isfile() and parts[-1] == "meminfo" and parts[-2].startswith("node"):
                node = int(parts[-2][4:])
                text = tar.extractfile(m).read().decode()  # type: ignore[union-attr]
                out[node] = {
                    line.split(":")[0].split()[-1]: int(line.split(":")[1].split()[0])
                    for line in text.splitlines()
                    if ":" in line
                }
    return out


WITH_NODES = sorted(n for n, exp in FIXTURES.items() if exp["nodes"])
WITHOUT_NODES = sorted(n for n, exp in FIXTURES.items() if not exp["nodes"])


@pytest.mark.parametrize("name", WITH_NODES)
def test_fixture_without_proc_meminfo_is_built_from_its_nodes(name: str) -> None:
    exp = FIXTURES[name]
    files = node_meminfo_values(name)
    machine, facts = load_dump(without_proc_meminfo(name))
    total_kb = sum(v["MemTotal"] for v in files.values())
    assert total_kb == sum(exp["nodes"].values())
    assert facts.mem_total == machine.mem_total == total_kb * 1024
    assert facts.mem_free == sum(v["MemFree"] for v in files.values()) * 1024
    assert facts.meminfo_source == "nodes" and "proc/meminfo" in facts.missing
    assert [n.id for n in facts.nodes] == sorted(exp["nodes"])
    for node in facts.nodes:
        assert node.mem_total == exp["nodes"][node.id] * 1024
        for size, total in exp["node_pools"].get(node.id, {}).items():
            assert node.hugepages[size].total == total
        if "HugePages_Free" in files.get(node.id, {}):
            assert node.hugepages[2 * M].free == files[node.id]["HugePages_Free"]
    for size, total in exp["global_totals"].items():
        assert machine.pool_total(size) == total
    assert machine.arch == exp["arch"] and sorted(machine.hugepage_sizes) == exp["sizes"]
    assert facts.default_hugepage_size == 2 * M  # the PMD size: no Hugepagesize line
    assert facts.mem_available is None and 0 < machine.mem_available <= machine.mem_total
    listed = ",".join(str(n) for n in sorted(files))
    assert facts.notes[0] == (
        f"no proc/meminfo: MemTotal {total_kb} kB is the sum of node(s) {listed}'s MemTotal "
        "(sys/devices/system/node/nodeN/meminfo); MemFree, page cache and SReclaimable are "
        "summed likewise"
    )
    for key, instead, _code in MISSING_FIGURES:
        assert f"no proc/meminfo: {key} not in the dump ({instead})" in facts.notes
    assert any(n.startswith("no proc/meminfo, so no MemAvailable: estimated") for n in facts.notes)
    assert not any("kernel before 3.14" in n for n in facts.notes)
    # sglang reads that estimate as MemAvailable (not psutil's fallback), and the note says so
    assert machine.mem_available_line and machine.mem_available is not None
    assert any("shows it as its MemAvailable line" in n for n in facts.notes)
    machine.validate()


@pytest.mark.parametrize("name", WITHOUT_NODES)
def test_fixture_with_neither_file_is_refused_in_one_line(name: str, tmp_path: Path) -> None:
    p = tmp_path / f"{name}.tar.gz"
    p.write_bytes(without_proc_meminfo(name, "w:gz"))
    with pytest.raises(DumpError) as e:
        load_dump(p)
    assert str(e.value) == f"{p}: {NOT_A_DUMP}" and e.value.exit_code == 65


def test_directory_dump_without_proc_meminfo(tmp_path: Path) -> None:
    name = "32intel64-2p8co2t+8ve"
    with tarfile.open(fileobj=io.BytesIO(without_proc_meminfo(name))) as tar:
        tar.extractall(tmp_path, filter="data")
    (top,) = tmp_path.iterdir()
    for root in (tmp_path, top):  # the dump directory itself, or the one holding it
        machine, facts = load_dump(root)
        assert machine.mem_total == (47925628 + 49519964) * 1024
        assert [n.mem_total for n in machine.nodes] == [47925628 * 1024, 49519964 * 1024]
        assert machine.pool_total(2 * M) == 4096 and machine.pool_total(G) == 0
        assert facts.kernel_version == "3.10.0-1160.15.2.el7.x86_64"


def test_node_meminfo_without_memtotal_names_proc_meminfo() -> None:
    raw = b"Node 0 MemFree: 100 kB\n"
    with pytest.raises(DumpError) as e:
        load_dump(tar_bytes({"H/sys/devices/system/node/node0/meminfo": raw}))
    assert str(e.value) == (
        "<bytes>:H/proc/meminfo: missing, and no sys/devices/system/node/nodeN/meminfo with a "
        "MemTotal line to build the machine from"
    )


def test_malformed_node_meminfo_names_its_line() -> None:
    raw = b"Node 0 MemTotal: 100 kB\nNode 0 MemFree: lots\n"
    with pytest.raises(DumpError) as e:
        load_dump(tar_bytes({"H/sys/devices/system/node/node0/meminfo": raw}))
    assert str(e.value) == (
        "<bytes>:H/sys/devices/system/node/node0/meminfo:2: cannot read value 'lots' for MemFree"
    )


# ---- generated variants ---------------------------------------------------------------------

_node = st.fixed_dictionaries(
    {
        "total_kb": st.integers(1 << 10, 1 << 34),
        "free_frac": st.floats(0, 1),
        "pages": st.one_of(st.none(), st.integers(0, 4096)),  # None: no HugePages_* lines
        "meminfo": st.booleans(),
    }
)


@settings(max_examples=40, deadline=None)
@given(nodes=st.lists(_node, min_size=1, max_size=8), sysfs_pool=st.booleans())
def test_generated_node_only_dumps_sum_their_files(nodes: list[dict], sysfs_pool: bool) -> None:
    if not any(n["meminfo"] for n in nodes):
        nodes[0]["meminfo"] = True
    files: dict[str, bytes] = {}
    for i, n in enumerate(nodes):
        base = f"H/sys/devices/system/node/node{i}"
        files[f"{base}/cpulist"] = f"{i}\n".encode()
        if not n["meminfo"]:
            continue
        free = int(n["total_kb"] * n["free_frac"])
        text = f"Node {i} MemTotal: {n['total_kb']} kB\nNode {i} MemFree: {free} kB\n"
        if n["pages"] is not None:
            text += f"Node {i} HugePages_Total: {n['pages']}\nNode {i} HugePages_Free: 0\n"
            text += f"Node {i} HugePages_Surp: 0\n"
        files[f"{base}/meminfo"] = text.encode()
        if sysfs_pool:
            files[f"{base}/hugepages/hugepages-2048kB/nr_hugepages"] = b"%d\n" % (n["pages"] or 0)
    files["H/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"] = b"%d\n" % sum(
        n["pages"] or 0 for n in nodes if n["meminfo"]
    )
    machine, facts = load_dump(tar_bytes(files))
    known = [n["total_kb"] * 1024 for n in nodes if n["meminfo"]]
    assert facts.mem_total == machine.mem_total == sum(known)
    assert len(machine.nodes) == len(nodes)
    for i, n in enumerate(nodes):
        if n["meminfo"]:
            assert machine.nodes[i].mem_total == n["total_kb"] * 1024
        if n["meminfo"] and (sysfs_pool or n["pages"] is not None):
            assert machine.nodes[i].hugepages[2 * M].total == (n["pages"] or 0)
    assert machine.pool_total(2 * M) == sum(n["pages"] or 0 for n in nodes if n["meminfo"])
    assert facts.notes[0].startswith(f"no proc/meminfo: MemTotal {sum(known) // 1024} kB")


# ---- issue 28 point 4: hugetlb, page cache and MemAvailable from the node files -------------


def node_dump(nodes: dict[int, str], extra: dict[str, str] | None = None) -> bytes:
    """A dump of node files only: {node: its meminfo lines without the 'Node N ' prefix}."""
    files = {
        f"H/sys/devices/system/node/node{n}/meminfo": "".join(
            f"Node {n} {line}\n" for line in text.strip().splitlines()
        ).encode()
        for n, text in nodes.items()
    }
    files["H/proc/cpuinfo"] = b"processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu lm\n"
    files.update({f"H/{k}": v.encode() for k, v in (extra or {}).items()})
    return tar_bytes(files)


def test_node_hugepages_lines_mean_a_kernel_with_hugetlb() -> None:
    pages = "HugePages_Total: 16\nHugePages_Free: 10\nHugePages_Surp: 0"
    m, f = load_dump(
        node_dump({n: f"MemTotal: 8388608 kB\nMemFree: 4194304 kB\n{pages}" for n in (0, 1)})
    )
    assert (m.hugepage_sizes, m.default_hugepage_size) == ([2 * M], 2 * M)
    assert m.pool_total(2 * M) == 32 and m.pool_free(2 * M) == 20
    assert [n.hugepages[2 * M].total for n in m.nodes] == [16, 16]
    assert not any("CONFIG_HUGETLB_PAGE" in n for n in f.notes)
    assert (
        "no hugepage size in the dump, but the nodes' meminfo has HugePages_* lines (hugetlb is "
        "built in): the default size taken as x86_64's, 2048 kB"
    ) in f.notes


def test_node_hugepages_directories_give_the_sizes() -> None:
    d = "sys/devices/system/node/node{}/hugepages/hugepages-{}kB/nr_hugepages"
    extra = {d.format(n, kb): "2\n" for n in (0, 1) for kb in (2048, 1048576)}
    m, f = load_dump(
        node_dump({n: "MemTotal: 8388608 kB\nMemFree: 4194304 kB" for n in (0, 1)}, extra)
    )
    assert m.hugepage_sizes == [2 * M, G] and m.default_hugepage_size == 2 * M
    assert m.pool_total(G) == 4 and not any("CONFIG_HUGETLB_PAGE" in n for n in f.notes)


def test_page_cache_from_the_nodes_filepages() -> None:
    # old kernels' node files: FilePages, no Active(file)/Inactive(file); 2 x 387840 = 775680 kB
    m, f = load_dump(
        node_dump(
            {n: "MemTotal: 8388608 kB\nMemFree: 4194304 kB\nFilePages: 387840 kB" for n in (0, 1)}
        )
    )
    assert f.page_cache == m.page_cache == 775680 * 1024
    assert [n.page_cache for n in m.nodes] == [387840 * 1024] * 2
    assert (
        "the nodes' meminfo has no Active(file)/Inactive(file): page cache taken as their "
        "FilePages - Shmem (775680 kB)"
    ) in f.notes
    (note,) = [n for n in f.notes if "so no MemAvailable" in n]
    assert "page cache 775680 kB" in note


def test_one_memavailable_when_the_nodes_give_no_memfree() -> None:
    # hwloc's 4fake-4gr1nu1pu: four 1 GiB nodes, MemTotal only
    from umbp_sim.sglang.host_memory import host_available_bytes
    from umbp_sim.sim import simulate

    m, f = load_dump(node_dump({n: "MemTotal: 1048576 kB" for n in range(4)}))
    (note,) = [n for n in f.notes if "so no MemAvailable" in n]
    assert m.mem_available == 4 * G - 10240 * K  # MemTotal above the low watermarks
    assert f"at {m.mem_available // K} kB from MemFree {4 * G // K} kB (not in the dump:" in note
    with simulate(m) as host:
        meminfo = parse_meminfo(host.read("/proc/meminfo"))
    assert meminfo["MemAvailable"] == m.mem_available  # the simulated host shows the same
    kb = {k: v // 1024 for k, v in meminfo.items()}
    assert host_available_bytes(kb) == m.mem_available  # and sglang reads the same
