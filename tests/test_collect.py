"""``umbp-sim collect``: a dump of this host that Machine.from_dump reads back as this host."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest
from fake_dumps import CGROUP_V2_HOST, write_tree

from umbp_sim import cli
from umbp_sim.collect import CollectError, collect
from umbp_sim.dump import load_dump, parse_meminfo

NODE = "/sys/devices/system/node"


def live_int(path: str) -> int:
    with open(path) as f:
        return int(f.read())


def test_round_trip_describes_this_host(tmp_path: Path) -> None:
    out = tmp_path / "host.tar.gz"
    res = collect(str(out), "here")
    machine, facts = load_dump(out)
    live = parse_meminfo(open("/proc/meminfo").read())
    assert facts.mem_total == live["MemTotal"]  # MemTotal does not move
    assert machine.kernel_version == os.uname().release
    sizes = sorted(
        int(d[len("hugepages-") : -2]) * 1024 for d in os.listdir("/sys/kernel/mm/hugepages")
    )
    assert machine.hugepage_sizes == sizes
    assert machine.default_hugepage_size == live["Hugepagesize"]
    nodes = sorted(int(d[4:]) for d in os.listdir(NODE) if d[4:].isdigit() and d.startswith("node"))
    assert machine.node_ids() == nodes
    for node in machine.nodes:
        for size in sizes:
            d = f"{NODE}/node{node.id}/hugepages/hugepages-{size // 1024}kB"
            assert node.hugepages[size].total == live_int(f"{d}/nr_hugepages")
            assert node.hugepages[size].free == live_int(f"{d}/free_hugepages")
    assert machine.overcommit_memory == live_int("/proc/sys/vm/overcommit_memory")
    assert machine.overcommit_ratio == live_int("/proc/sys/vm/overcommit_ratio")
    assert facts.rlimit_as == "unlimited" or isinstance(facts.rlimit_as, int)
    assert facts.kernel_version_source == "osrelease"
    assert "proc/meminfo" in res.collected and "proc/self/limits" in res.collected
    with tarfile.open(out) as tar:
        names = tar.getnames()
        manifest = json.load(tar.extractfile("here/umbp-sim-collect.json"))  # type: ignore[arg-type]
    assert all(n == "here" or n.startswith("here/") for n in names)
    assert manifest["collected"] == sorted(res.collected)
    assert set(manifest["missing"]) == set(res.missing)
    for rel in manifest["collected"]:
        assert f"here/{rel}" in names
    # this host's memory cgroup limit (v2, or v1 translated) is recorded or said missing
    assert "sys/fs/cgroup/memory.max" in res.collected + list(res.missing)


def test_collect_from_a_fake_root_with_cgroup_v2_limits(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "root", CGROUP_V2_HOST)
    out = tmp_path / "fake.tar"
    res = collect(str(out), "fake", root=str(root))
    m, f = load_dump(out)
    assert m.memcg_max == 4 << 30  # the parent's limit binds
    assert m.hugetlb_cgroup_max == {2 << 20: 2 << 20}
    assert m.hugetlb_cgroup_rsvd_max == {2 << 20: 4 << 20}  # rsvd.max: collected, then loaded
    assert "fake/sys/fs/cgroup/hugetlb.2MB.rsvd.max" in _names(out)
    assert m.pool_total(2 << 20) == 3 and m.kernel_version == "5.15.0"
    assert "proc/self/limits" in res.missing and "proc/sys/vm/overcommit_memory" in res.missing
    assert any("binding level /job" in n for n in res.notes)


def test_unwritable_output_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "no" / "such" / "dir.tar.gz"
    code = cli.main(["collect", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == CollectError.exit_code == 73
    assert err == f"umbp-sim collect: -o {out}: cannot write: No such file or directory\n"
    assert not list(tmp_path.iterdir())
    with pytest.raises(SystemExit) as ei:
        cli.main(["collect"])
    assert ei.value.code == 64


def _names(tarball: Path) -> list[str]:
    with tarfile.open(tarball) as tar:
        return tar.getnames()
