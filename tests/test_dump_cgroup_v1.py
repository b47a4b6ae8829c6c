"""cgroup v1 limits in a dump not written by umbp-sim's collectors (a copy of a container's
/sys/fs/cgroup on a v1 host, a sosreport): ``hugetlb.<size>.limit_in_bytes`` and
``memory.limit_in_bytes`` are read as v2's ``hugetlb.<size>.max`` and ``memory.max``
(umbp_sim/dump/read_system.py); v1's "no limit" is max."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_dumps import tar_bytes, write_tree

from umbp_sim.cli import main
from umbp_sim.dump import load_dump

MiB, GiB = 1 << 20, 1 << 30
HOST = {
    "proc/meminfo": (
        "MemTotal: 67108864 kB\nMemFree: 60000000 kB\nMemAvailable: 60000000 kB\n"
        "HugePages_Total: 4096\nHugePages_Free: 4096\nHugePages_Rsvd: 0\nHugePages_Surp: 0\n"
        "Hugepagesize: 2048 kB\n"
    ),
    "proc/sys/kernel/osrelease": "5.15.0\n",
    "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages": "4096\n",
    "sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages": "4096\n",
    "sys/kernel/mm/hugepages/hugepages-2048kB/resv_hugepages": "0\n",
    "sys/kernel/mm/hugepages/hugepages-2048kB/surplus_hugepages": "0\n",
}
V1 = {
    "sys/fs/cgroup/hugetlb/hugetlb.2MB.limit_in_bytes": "1073741824\n",
    "sys/fs/cgroup/hugetlb/hugetlb.2MB.rsvd.limit_in_bytes": "9223372036854771712\n",
    "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
}


@pytest.mark.parametrize("flat", [False, True])
def test_v1_limits_are_read_as_v2(tmp_path: Path, flat: bool) -> None:
    v1 = {k.replace("hugetlb/", "").replace("memory/", "") if flat else k: v for k, v in V1.items()}
    machine, facts = load_dump(str(write_tree(tmp_path / "host", {**HOST, **v1})))
    assert machine.hugetlb_cgroup_max == {2 * MiB: GiB}
    assert machine.hugetlb_cgroup_rsvd_max == {}  # v1's PAGE_COUNTER_MAX pages: no limit
    assert machine.memcg_max is None
    assert facts.hugetlb_cgroup_max == {2 * MiB: GiB}
    assert facts.hugetlb_cgroup_rsvd_max == {2 * MiB: "max"} and facts.memcg_max == "max"
    where = "sys/fs/cgroup/" if flat else "sys/fs/cgroup/hugetlb/"
    v1_notes = [n for n in facts.notes if n.code == "cgroup-v1-limit"]
    assert (
        f"{where}hugetlb.2MB.limit_in_bytes: cgroup v1's hugetlb.2MB.limit_in_bytes, read as "
        "v2's hugetlb.2MB.max (1073741824)"
    ) in v1_notes


def test_v2_name_wins_over_v1_file_by_file(tmp_path: Path) -> None:
    files = {**HOST, **V1, "sys/fs/cgroup/hugetlb.2MB.max": "max\n",
             "sys/fs/cgroup/memory/memory.limit_in_bytes": "2147483648\n"}  # fmt: skip
    machine, facts = load_dump(str(write_tree(tmp_path / "host", files)))
    assert machine.hugetlb_cgroup_max == {}
    assert machine.memcg_max == 2 * GiB  # no memory.max: v1's
    assert not any("hugetlb.2MB.limit_in_bytes" in n for n in facts.notes)


def test_a_tarball_s_v1_limit_gives_the_sigbus(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    dump = tmp_path / "pod.tar"
    dump.write_bytes(tar_bytes({f"pod/{k}": v.encode() for k, v in {**HOST, **V1}.items()}))
    assert main(["replay", str(dump), "--size", "4GiB", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["outcome"], doc["signal"]) == ("crashed", "SIGBUS")
    assert (
        "the hugetlb cgroup limit for 2048 kB pages is 1073741824 bytes (512 pages), 2048 "
        "needed: enforced at fault time, and the process is killed by SIGBUS"
    ) in doc["causes"]
