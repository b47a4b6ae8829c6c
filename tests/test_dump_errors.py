"""Hand-made dumps: layouts, inference rules, and one-line errors naming file and line."""

from __future__ import annotations

import io
import os
import re
import tarfile
from pathlib import Path

import pytest

from umbp_sim.dump import (
    DumpError,
    load_dump,
    load_machine,
    parse_cgroup_max,
    parse_limits,
    parse_meminfo,
    parse_nodelist,
    spread,
)

M = 1 << 20
MEMINFO = (
    "MemTotal:       16777216 kB\n"
    "MemFree:        8388608 kB\n"
    "MemAvailable:   9000000 kB\n"
    "SwapTotal:            0 kB\n"
    "CommitLimit:    6291456 kB\n"
    "Committed_AS:     62864 kB\n"
    "HugePages_Total:    1000\n"
    "HugePages_Free:      900\n"
    "HugePages_Rsvd:       10\n"
    "HugePages_Surp:        0\n"
    "Hugepagesize:       2048 kB\n"
    "Hugetlb:         2048000 kB\n"
)


def make_tar(files: dict[str, str | bytes], mode: str = "w:gz", links=()) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:
        for name, data in files.items():
            raw = data.encode() if isinstance(data, str) else data
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
        for name, target in links:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buf.getvalue()


def two_node_files(top: str = "H/") -> dict[str, str]:
    hp = "sys/kernel/mm/hugepages/hugepages-2048kB/"
    files = {
        f"{top}proc/meminfo": MEMINFO,
        f"{top}{hp}nr_hugepages": "1000\n",
        f"{top}{hp}free_hugepages": "900\n",
        f"{top}{hp}resv_hugepages": "10\n",
        f"{top}{hp}surplus_hugepages": "0\n",
        f"{top}{hp}nr_overcommit_hugepages": "5\n",
        f"{top}sys/devices/system/node/online": "0-1\n",
        f"{top}sys/devices/system/node/possible": "0-1\n",
        f"{top}proc/sys/kernel/osrelease": "5.4.0-100-generic\n",
        f"{top}proc/self/limits": (
            "Limit                     Soft Limit           Hard Limit           Units     \n"
            "Max address space         1073741824           unlimited            bytes     \n"
        ),
        f"{top}sys/fs/cgroup/memory.max": "8589934592\n",
        f"{top}sys/fs/cgroup/hugetlb.2MB.max": "max\n",
        f"{top}proc/sys/vm/overcommit_memory": "2\n",
        f"{top}proc/sys/vm/overcommit_ratio": "80\n",
    }
    for n in (0, 1):
        files[f"{top}sys/devices/system/node/node{n}/meminfo"] = (
            f"Node {n} MemTotal:        8388608 kB\nNode {n} MemFree:         4194304 kB\n"
        )
    return files


def write_dir(root: Path, files: dict[str, str]) -> None:
    for name, data in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(data)


def test_tarball_directory_and_root_directory_agree(tmp_path: Path) -> None:
    files = two_node_files()
    (tmp_path / "d.tar.gz").write_bytes(make_tar(files))
    write_dir(tmp_path / "tree", files)
    a = load_machine(tmp_path / "d.tar.gz")
    b = load_machine(tmp_path / "tree")  # detects the H/ level
    c = load_machine(tmp_path / "tree" / "H")  # the root itself
    assert a == b == c
    assert a.name == "H" and a.kernel_version == "5.4.0-100-generic"
    assert a.rlimit_as == 1 << 30 and a.memcg_max == 8 << 30 and a.hugetlb_cgroup_max == {}
    assert a.overcommit_memory == 2 and a.overcommit_ratio == 80
    assert a.hugepages_reserved == {2 * M: 10} and a.nr_overcommit_hugepages == {2 * M: 5}


def test_missing_per_node_files_spread_like_the_kernel(tmp_path: Path) -> None:
    m, f = load_dump(make_tar(two_node_files()))
    assert [n.hugepages[2 * M].total for n in m.nodes] == [500, 500]
    assert [n.hugepages[2 * M].free for n in m.nodes] == [450, 450]
    assert any("1000 pages spread round robin" in n for n in f.notes)
    assert spread(1001, 2) == [501, 500] and spread(3, 4) == [1, 1, 1, 0]


def test_bare_meminfo(tmp_path: Path) -> None:
    p = tmp_path / "meminfo"
    p.write_text(MEMINFO)
    m, f = load_dump(p)
    assert m.hugepage_sizes == [2 * M] and m.pool_total(2 * M) == 1000
    assert f.nodes == [] and f.missing == []
    assert m.kernel_version == "6.18.0" and f.kernel_version_source == "default"


def test_inconsistent_nodes_keep_node_facts() -> None:
    files = two_node_files()
    for n, total in ((0, 600), (1, 300)):  # 900 on nodes, 1000 globally
        d = f"H/sys/devices/system/node/node{n}/hugepages/hugepages-2048kB/"
        files[d + "nr_hugepages"] = f"{total}\n"
        files[d + "free_hugepages"] = f"{total}\n"
    m, f = load_dump(make_tar(files))
    assert m.pool_total(2 * M) == 900 and f.hugepages[2 * M].total == 1000
    assert any("nodes hold 900, the global count is 1000" in n for n in f.notes)


def err(data: bytes | Path) -> DumpError:
    with pytest.raises(DumpError) as ei:
        load_dump(data)
    return ei.value


def test_malformed_meminfo_names_file_and_line(tmp_path: Path) -> None:
    files = two_node_files()
    files["H/proc/meminfo"] = MEMINFO.replace("HugePages_Free:      900", "HugePages_Free: abc kB")
    p = tmp_path / "dump.tar.bz2"
    p.write_bytes(make_tar(files, "w:bz2"))
    e = err(p)
    assert str(e) == f"{p}:H/proc/meminfo:8: cannot read value 'abc kB' for HugePages_Free"
    assert e.kind == "malformed" and e.exit_code == 65


def test_missing_meminfo_vs_malformed_sysfs(tmp_path: Path) -> None:
    e = err(make_tar({"H/sys/devices/system/node/online": "0\n"}))
    assert e.kind == "missing" and "no proc/meminfo" in str(e)
    files = two_node_files()
    files["H/sys/devices/system/node/online"] = "0-x\n"
    e = err(make_tar(files))
    assert str(e) == "<bytes>:H/sys/devices/system/node/online:1: cannot read node list '0-x'"
    files = two_node_files()
    files["H/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages"] = "99999999999999999999999\n"
    assert "does not fit in 64 bits" in str(err(make_tar(files)))


def test_corrupt_tarball_and_non_dump(tmp_path: Path) -> None:
    good = make_tar(two_node_files(), "w:bz2")
    p = tmp_path / "cut.tar.bz2"
    p.write_bytes(good[: len(good) // 2])
    e = err(p)
    assert e.kind == "unreadable"
    assert re.fullmatch(
        rf"{re.escape(str(p))}: cut short: the bzip2 data ends before its stream does \(after "
        r"\d+ bytes unpacked\); the files after that point are missing",
        str(e),
    )
    assert err(tmp_path / "nope").kind == "missing"
    (tmp_path / "empty").mkdir()
    assert "not a machine dump" in str(err(tmp_path / "empty"))
    q = tmp_path / "notes.txt"
    q.write_text("hello world\n")
    assert str(err(q)) == (  # text is a paste (docs/pastes.md): nothing in it is readable
        f"{q}:1: nothing umbp-sim reads: 1 line(s), none in a form it knows (the first: "
        "'hello world'); docs/pastes.md lists the forms"
    )


def test_links_leaving_the_dump_are_refused(tmp_path: Path) -> None:
    files = two_node_files()
    del files["H/proc/self/limits"]
    data = make_tar(files, links=[("H/proc/self/limits", "/etc/passwd")])
    with pytest.raises(DumpError) as e:
        load_dump(data)
    leaves = "a symbolic link leaving the dump: not followed (a dump holds copies, not links)"
    assert str(e.value) == f"<bytes>:H/proc/self/limits: {leaves}"
    data = make_tar(files, links=[("H/proc/sys/vm/overcommit_kbytes", "../../../../../x")])
    with pytest.raises(DumpError, match="overcommit_kbytes: a symbolic link leaving the dump"):
        load_dump(data)
    (tmp_path / "outside").write_text("1\n")
    write_dir(tmp_path / "t", two_node_files(""))
    os.symlink(tmp_path / "outside", tmp_path / "t/proc/sys/vm/overcommit_kbytes")
    with pytest.raises(DumpError) as e:
        load_dump(tmp_path / "t")
    assert str(e.value) == f"{tmp_path}/t/proc/sys/vm/overcommit_kbytes: {leaves}"


def test_parse_helpers() -> None:
    assert parse_nodelist("0,2-3\n") == [0, 2, 3] and parse_nodelist("\n") == []
    with pytest.raises(DumpError, match="beyond the kernel's limit"):
        parse_nodelist("0-4294967295")
    assert parse_cgroup_max("max\n") is None and parse_cgroup_max("4096\n") == 4096
    lim = parse_limits(open("/proc/self/limits").read())
    assert "Max address space" in lim
    with pytest.raises(DumpError, match="MemAvailable appears twice"):
        parse_meminfo("MemTotal: 1 kB\nMemAvailable: 1 kB\nMemAvailable: 2 kB\n")
