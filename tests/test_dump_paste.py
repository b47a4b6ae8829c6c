"""Pastes (issue 39 parts 1 and 2): text as people paste it into a ticket, read as pasted, each
value with the line it came from, and nothing read from a line that is not there.

Every fixture is written here as the tool prints it (formats: docs/pastes.md)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from umbp_sim.cli import main
from umbp_sim.dump import DumpError, load_dump

K, M, G = 1 << 10, 1 << 20, 1 << 30
LINE = (
    "RuntimeError: UMBPHostMemAllocator.alloc(1073741824 bytes) failed "
    "(requested_backing=UMBPHostBufferBacking.AnonymousHugetlb, numa_node=-1)."
)

GREP_HUGEPAGES = """\
HugePages_Total:    8192
HugePages_Free:     8192
HugePages_Rsvd:        0
HugePages_Surp:        0
"""

GREP_I_HUGE = """\
AnonHugePages:    614400 kB
ShmemHugePages:        0 kB
FileHugePages:         0 kB
HugePages_Total:    1024
HugePages_Free:      512
HugePages_Rsvd:        0
HugePages_Surp:        0
Hugepagesize:       2048 kB
Hugetlb:         2097152 kB
"""

NUMACTL = """\
$ numactl -H
available: 2 nodes (0-1)
node 0 cpus: 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 48 49 50 51 52 53
54 55 56 57 58 59 60 61 62 63 64 65 66 67 68 69 70 71
node 0 size: 257597 MB
node 0 free: 8373 MB
node 1 cpus: 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 72 73
node 1 size: 258039 MB
node 1 free: 120433 MB
node distances:
node   0   1
  0:  10  21
  1:  21  10
"""

NODE_MEMINFO = """\
$ cat /sys/devices/system/node/node*/meminfo | grep Huge
Node 0 AnonHugePages:         0 kB
Node 0 ShmemHugePages:        0 kB
Node 0 HugePages_Total: 122880
Node 0 HugePages_Free:       0
Node 0 HugePages_Surp:       0
Node 1 AnonHugePages:         0 kB
Node 1 ShmemHugePages:        0 kB
Node 1 HugePages_Total:      0
Node 1 HugePages_Free:       0
Node 1 HugePages_Surp:       0
"""

GREP_R_NODE1 = """\
/sys/devices/system/node/node1/hugepages/hugepages-1048576kB/free_hugepages:0
/sys/devices/system/node/node1/hugepages/hugepages-1048576kB/nr_hugepages:0
/sys/devices/system/node/node1/hugepages/hugepages-1048576kB/surplus_hugepages:0
/sys/devices/system/node/node1/hugepages/hugepages-2048kB/free_hugepages:4000
/sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages:4096
/sys/devices/system/node/node1/hugepages/hugepages-2048kB/surplus_hugepages:0
"""

SYSFS_GLOBAL = """\
root@gpu-17:~# grep -r . /sys/kernel/mm/hugepages
/sys/kernel/mm/hugepages/hugepages-1048576kB/free_hugepages:16
/sys/kernel/mm/hugepages/hugepages-1048576kB/resv_hugepages:0
/sys/kernel/mm/hugepages/hugepages-1048576kB/surplus_hugepages:0
/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages_mempolicy:16
/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages:16
/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_overcommit_hugepages:0
/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages:0
/sys/kernel/mm/hugepages/hugepages-2048kB/resv_hugepages:0
/sys/kernel/mm/hugepages/hugepages-2048kB/surplus_hugepages:0
/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages_mempolicy:0
/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages:0
/sys/kernel/mm/hugepages/hugepages-2048kB/nr_overcommit_hugepages:0
"""

PROMPTS = """\
user@gpu-node-3:~$ cat /proc/sys/vm/nr_hugepages
2048
[root@gpu-node-3 ~]# cat /sys/devices/system/node/node1/hugepages/hugepages-2048kB/free_hugepages
0
# cat /proc/sys/vm/overcommit_memory
1
$ sysctl -n vm.nr_overcommit_hugepages
64
"""

SYSCTL = """\
$ sysctl -a 2>/dev/null | grep -E 'huge|overcommit'
vm.hugetlb_shm_group = 0
vm.nr_hugepages = 4096
vm.nr_hugepages_mempolicy = 4096
vm.nr_overcommit_hugepages = 0
vm.overcommit_kbytes = 0
vm.overcommit_memory = 2
vm.overcommit_ratio = 90
"""

# DPDK's usertools/dpdk-hugepages.py -s: releases before 23.11 (fixed columns) and after
DPDK_OLD = """\
Node Pages Size Total
0    1024  2Mb    2Gb
1    4     1Gb    4Gb

Hugepages mounted on /dev/hugepages /mnt/huge1G
"""
DPDK_NEW = """\
Node  Pages  Size  Total
0      1024   2Mb    2Gb
1         4   1Gb    4Gb

Huge page filesystems mounted at: /dev/hugepages /mnt/huge1G
"""

# SPDK's scripts/setup.sh status (printf "%-6s %10s %8s / %6s"), then its device table
SPDK = """\
# ./scripts/setup.sh status
Hugepages
node     hugesize     free /  total
node0   1048576kB        0 /      0
node0      2048kB     1010 /   1024
node1   1048576kB        0 /      0
node1      2048kB        0 /      0

Type     BDF             Vendor Device NUMA    Driver           Device     Block devices
NVMe     0000:5e:00.0    8086   0a54   0       vfio-pci         -          -
NVMe     0000:d8:00.0    8086   0a54   1       nvme             nvme1      nvme1n1
"""

LIMITS = """\
$ cat /proc/41177/limits
Limit                     Soft Limit           Hard Limit           Units
Max cpu time              unlimited            unlimited            seconds
Max file size             unlimited            unlimited            bytes
Max data size             unlimited            unlimited            bytes
Max stack size            8388608              unlimited            bytes
Max locked memory         65536                65536                bytes
Max address space         68719476736          unlimited            bytes
Max open files            1048576              1048576              files
"""

CGROUP_V1 = """\
$ cat /sys/fs/cgroup/hugetlb/kubepods/burstable/pod1d5e/hugetlb.2MB.limit_in_bytes
0
$ cat /sys/fs/cgroup/hugetlb/kubepods/burstable/pod1d5e/hugetlb.1GB.limit_in_bytes
9223372036854771712
$ cat /sys/fs/cgroup/memory/memory.limit_in_bytes
68719476736
"""

CGROUP_V2 = """\
/ # cd /sys/fs/cgroup && grep . hugetlb.*.max memory.max
hugetlb.1GB.max:max
hugetlb.1GB.rsvd.max:max
hugetlb.2MB.max:4294967296
hugetlb.2MB.rsvd.max:max
memory.max:34359738368
"""

UNAME = """\
$ uname -r
5.15.0-91-generic
"""

# a whole meminfo the ticket cut off before its hugepage lines
CUT_MEMINFO = """\
MemTotal:       527929780 kB
MemFree:        402344716 kB
MemAvailable:   478210064 kB
Buffers:           12820 kB
Cached:         76233372 kB
SwapCached:            0 kB
Active:         19322532 kB
Inactive:       62041444 kB
Active(anon):    5233336 kB
Inactive(anon):       44 kB
Active(file):   14089196 kB
Inactive(file): 62041400 kB
"""

# `egrep 'MemTotal|MemFree|HugePages_' /proc/meminfo`: no MemAvailable, no Hugetlb line
EGREP = """\
MemTotal:       263718212 kB
MemFree:        198391820 kB
HugePages_Total:       0
HugePages_Free:        0
HugePages_Rsvd:        0
HugePages_Surp:        0
"""


def facts_of(text: str):  # type: ignore[no-untyped-def]
    return load_dump(text.encode())


def values(facts) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {p.name: p.value for p in facts.paste_facts}


def codes(facts) -> list[str]:  # type: ignore[no-untyped-def]
    return [n.code for n in facts.notes]


def test_grep_hugepages_is_read_with_every_assumption_noted() -> None:
    m, f = facts_of(GREP_HUGEPAGES)
    assert m.hugepage_sizes == [2 * M] and m.default_hugepage_size == 2 * M
    assert (m.pool_total(2 * M), m.pool_free(2 * M)) == (8192, 8192)
    # the kernel is not in the paste: a recent one, said so, never one dated by lines not there
    assert (m.kernel_version, f.kernel_version_source) == ("6.18.0", "default")
    for code in ("kernel-version-unknown", "memory-assumed", "hugepage-size-assumed",
                 "limits-assumed"):  # fmt: skip
        assert code in codes(f), code
    assert "no-hugetlb" not in codes(f) and "kernel-version-assumed" not in codes(f)
    assert (
        "the paste has HugePages_* lines but no hugepage size: the default size taken as "
        "x86_64's, 2048 kB (`grep Hugepagesize /proc/meminfo` settles it)"
    ) in f.notes
    assert m.mem_total == 8192 * 2 * M + 256 * G  # the pools plus the assumed margin
    assert [(p.line, p.text) for p in f.paste_facts][0] == (1, "HugePages_Total:    8192")


def test_grep_i_huge() -> None:
    m, f = facts_of("```console\n" + GREP_I_HUGE + "```\n")  # as a ticket's markdown has it
    assert (m.pool_total(2 * M), m.pool_free(2 * M)) == (1024, 512)
    assert values(f)["proc/meminfo:Hugetlb"] == "2097152 kB"
    assert f.paste_unread == []  # AnonHugePages and friends: meminfo lines it does not use


def test_numactl_and_the_nodes_meminfo() -> None:
    m, f = facts_of(NUMACTL + NODE_MEMINFO)
    assert m.node_ids() == [0, 1]
    assert [n.mem_total for n in m.nodes] == [257597 * M, 258039 * M]
    assert [n.mem_free for n in m.nodes] == [8373 * M, 120433 * M]
    assert [n.distances for n in m.nodes] == [[10, 21], [21, 10]]
    assert m.nodes[1].cpus.startswith("24,25,26")
    assert [n.hugepages[2 * M].total for n in m.nodes] == [122880, 0]
    assert m.mem_total == (257597 + 258039) * M  # the nodes' sum, noted
    assert "memory-assumed" in codes(f) and f.paste_unread == []
    assert values(f)["sys/devices/system/node/node0/meminfo:MemTotal"] == f"{257597 * 1024} kB"


def test_grep_r_of_one_node_keeps_the_nodes_below_it() -> None:
    m, f = facts_of(GREP_R_NODE1)
    assert m.node_ids() == [0, 1]
    assert m.nodes[1].hugepages[2 * M].total == 4096 and m.nodes[1].hugepages[2 * M].free == 4000
    assert "paste-nodes-assumed" in codes(f)
    line = "/sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages:4096"
    (fact,) = [p for p in f.paste_facts if p.text == line]
    assert (fact.line, fact.value) == (5, "4096")


def test_sysfs_global_values_with_a_prompt() -> None:
    m, f = facts_of(SYSFS_GLOBAL)
    assert (m.pool_total(G), m.pool_free(G), m.pool_total(2 * M)) == (16, 16, 0)
    assert f.paste_unread == []


def test_values_after_cat_and_sysctl_n_prompts() -> None:
    m, f = facts_of(PROMPTS)
    v = values(f)
    assert v["proc/sys/vm/nr_hugepages"] == "2048"
    assert v["sys/devices/system/node/node1/hugepages/hugepages-2048kB/free_hugepages"] == "0"
    assert m.overcommit_memory == 1 and m.nr_overcommit_hugepages == {2 * M: 64}
    assert m.pool_total(2 * M) == 2048  # vm.nr_hugepages is the default size's pool
    assert f.paste_unread == []


def test_sysctl_lines() -> None:
    m, f = facts_of(SYSCTL)
    assert (m.overcommit_memory, m.overcommit_ratio, m.pool_total(2 * M)) == (2, 90, 4096)
    assert "pool-free-assumed" in codes(f)  # the count, not how many are free


@pytest.mark.parametrize("table", [DPDK_OLD, DPDK_NEW])
def test_dpdk_hugepages_show(table: str) -> None:
    m, f = facts_of(table)
    assert m.nodes[0].hugepages[2 * M].total == 1024 and m.nodes[1].hugepages[G].total == 4
    assert f.paste_unread == []


def test_spdk_setup_status_and_its_device_table() -> None:
    m, f = facts_of(SPDK)
    assert m.nodes[0].hugepages[2 * M].total == 1024
    assert m.nodes[0].hugepages[2 * M].free == 1010
    assert m.nodes[1].hugepages[2 * M].total == 0
    assert f.paste_unread == []


def test_proc_pid_limits() -> None:
    m, f = facts_of(LIMITS + GREP_HUGEPAGES)
    assert m.rlimit_as == 64 * G
    assert "limits-assumed" not in codes(f)


def test_cgroup_v1_limits() -> None:
    m, f = facts_of(CGROUP_V1 + GREP_I_HUGE)
    assert m.hugetlb_cgroup_max == {2 * M: 0}  # 1 GB: v1's "no limit"
    assert m.memcg_max == 64 * G


def test_cgroup_v2_limits() -> None:
    m, f = facts_of(CGROUP_V2 + GREP_I_HUGE)
    assert m.hugetlb_cgroup_max == {2 * M: 4 * G} and m.memcg_max == 32 * G


def test_uname_r_gives_the_kernel() -> None:
    m, f = facts_of(UNAME + GREP_I_HUGE)
    assert (m.kernel_version, f.kernel_version_source) == ("5.15.0-91-generic", "osrelease")
    assert "kernel-version-unknown" not in codes(f)


def test_a_mixed_paste_in_any_order_with_prompts_and_other_output() -> None:
    mixed = (
        "$ nvidia-smi -L\nGPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5c1f)\n"
        + SPDK
        + UNAME
        + "\n"
        + CGROUP_V2
        + NUMACTL
        + SYSCTL
        + GREP_I_HUGE.replace("512", "1010")
    )
    m, f = facts_of(mixed)
    assert m.kernel_version == "5.15.0-91-generic" and m.node_ids() == [0, 1]
    assert m.nodes[0].hugepages[2 * M].free == 1010 and m.hugetlb_cgroup_max == {2 * M: 4 * G}
    assert m.overcommit_memory == 2 and m.nodes[1].mem_total == 258039 * M
    assert [(u.line, u.text) for u in f.paste_unread] == [
        (2, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5c1f)")
    ]
    (note,) = [n for n in f.notes if n.code == "paste-unreadable"]
    assert note == (
        "1 line(s) of the paste in no form umbp-sim reads, not used: line 2 "
        "'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-'... (45 characters)"
    )


def test_a_path_wrapped_by_the_terminal() -> None:
    line = "/sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages:4096"
    m, f = facts_of(line[:60] + "\n" + line[60:] + "\n")
    assert m.nodes[1].hugepages[2 * M].total == 4096 and f.paste_unread == []
    assert [(p.line, p.text) for p in f.paste_facts] == [(1, line)]


def test_a_free_count_alone_is_a_pool_with_none_in_use() -> None:
    m, f = facts_of("HugePages_Free:     300\n")
    assert (m.pool_total(2 * M), m.pool_free(2 * M)) == (300, 300)
    assert (
        "proc/meminfo:HugePages_Total is not in the paste: taken as 300, the free count on line "
        "1 (no page in use)"
    ) in f.notes


def test_a_value_given_twice_uses_the_later_line() -> None:
    m, f = facts_of(GREP_HUGEPAGES + "$ echo 9000 > /proc/sys/vm/nr_hugepages\n" +
                    GREP_HUGEPAGES.replace("8192", "9000"))  # fmt: skip
    assert m.pool_total(2 * M) == 9000
    assert (
        "proc/meminfo:HugePages_Total is given twice, 8192 on line 1 and 9000 on line 6: "
        "line 6's is used"
    ) in f.notes


def test_a_cut_meminfo_is_not_a_kernel_without_hugetlb() -> None:
    m, f = facts_of(CUT_MEMINFO)
    assert "no-hugetlb" not in codes(f) and m.hugepage_sizes == [2 * M, G]
    assert m.pool_total(2 * M) == 0 and "hugepages-assumed" in codes(f)


def test_a_missing_memavailable_or_hugetlb_line_dates_nothing() -> None:
    m, f = facts_of(EGREP)
    assert (m.kernel_version, f.kernel_version_source) == ("6.18.0", "default")
    assert m.mem_available_line  # whether the host prints it: unknown, a recent kernel does
    assert not any("3.13" in n or "4.15" in n for n in f.notes)


def test_nothing_readable_is_one_error() -> None:
    with pytest.raises(DumpError) as e:
        load_dump(b"$ free -g\n              total        used        free\nMem:  503  95  383\n")
    assert str(e.value) == (
        "<bytes>:2: nothing umbp-sim reads: 2 line(s), none in a form it knows (the first: "
        "'total        used        free'); docs/pastes.md lists the forms"
    )
    assert e.value.exit_code == 65


def test_a_known_line_with_a_bad_value_names_the_line() -> None:
    with pytest.raises(DumpError) as e:
        load_dump(b"$ grep Huge /proc/meminfo\nHugePages_Total: lots\n")
    assert str(e.value) == "<bytes>:2: cannot read value 'lots' for HugePages_Total"


def test_a_full_dump_still_dates_its_kernel_from_meminfo() -> None:
    """The full-dump path is unchanged: a dump's meminfo without MemAvailable is 3.13's."""
    data = Path(__file__).parent / "data" / "machines" / "40intel64-2g2n4c+pcilocality.tar.bz2"
    m, f = load_dump(data)
    assert m.kernel_version == "3.13.0" and not f.paste and "paste" not in f.to_json()


def stdin(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(text.encode())))


def test_inspect_shows_each_value_with_its_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stdin(monkeypatch, "$ uname -r\n5.15.0-91-generic\nGPU 0\n" + GREP_HUGEPAGES)
    assert main(["inspect", "-"]) == 0
    out = capsys.readouterr().out
    assert "read from the paste (5 values):" in out
    assert "  line 2: proc/sys/kernel/osrelease = 5.15.0-91-generic    <- 5.15.0-91-generic" in out
    assert "  line 4: proc/meminfo:HugePages_Total = 8192    <- HugePages_Total:    8192" in out
    assert "not read (1 lines in no form umbp-sim reads):\n  line 3: GPU 0" in out
    stdin(monkeypatch, "$ uname -r\n5.15.0-91-generic\nGPU 0\n" + GREP_HUGEPAGES)
    assert main(["inspect", "-", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["paste"]["facts"][1] == {
        "fact": "proc/meminfo:HugePages_Total",
        "value": "8192",
        "line": 4,
        "text": "HugePages_Total:    8192",
    }
    assert doc["paste"]["unread"] == [{"line": 3, "text": "GPU 0"}]
    assert (doc["kernel_version"], doc["kernel_version_source"]) == (
        "5.15.0-91-generic",
        "osrelease",
    )


def test_a_grepd_meminfo_replayed_with_the_error_line_blames_no_old_kernel(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    paste = tmp_path / "ticket.txt"
    paste.write_text(EGREP)
    assert main(["replay", str(paste), "--error", LINE, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kernel_version"] == "6.18.0"
    text = json.dumps(doc)
    assert "ENOSYS" not in text and "3.13" not in text
    assert "kernel-version-unknown" in doc["cause_note_codes"]
    # every assumption in the JSON, with its code (the causes keep those that change the answer)
    assert "limits-assumed" in [n["code"] for n in doc["dump_notes"]]
    assert doc["paste"]["facts"][0] == {
        "fact": "proc/meminfo:MemTotal",
        "value": "263718212 kB",
        "line": 1,
        "text": "MemTotal:       263718212 kB",
    }


def test_replay_lists_the_assumptions(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    paste = tmp_path / "ticket.txt"
    paste.write_text(GREP_I_HUGE)
    assert main(["replay", str(paste), "--size", "1GiB"]) == 0
    out = capsys.readouterr().out
    assert (
        "dump note: the kernel release is not in the paste: taken as a recent kernel, 6.18.0 "
        "(MADV_POPULATE_WRITE, memfd_create with MFD_HUGETLB); `uname -r` settles it"
    ) in out
    assert "dump note: no cgroup or process limit in the paste: none assumed" in out


def test_node_free_counts_with_the_global_count_share_the_pages_in_use() -> None:
    paste = (
        "$ grep -r . /sys/devices/system/node/node*/hugepages/hugepages-2048kB/free_hugepages\n"
        "/sys/devices/system/node/node0/hugepages/hugepages-2048kB/free_hugepages:100\n"
        "/sys/devices/system/node/node1/hugepages/hugepages-2048kB/free_hugepages:0\n"
        + GREP_I_HUGE.replace("1024", "1101").replace("512", "100")
    )
    m, f = facts_of(paste)
    # 1001 pages in use (1101 less the 100 free), spread as the kernel spreads a pool
    assert [(n.hugepages[2 * M].total, n.hugepages[2 * M].free) for n in m.nodes] == [
        (601, 100),
        (500, 0),
    ]
    assert (
        "sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages is not in the "
        "paste: taken as 601, the free count on line 2 plus 501 of the 1001 pages in use (the "
        "global count on line 7 less the free pages shown, spread as the kernel spreads a pool)"
    ) in f.notes


# kubectl describe pod: the container's Limits, then its Requests
DESCRIBE_POD = """\
Name:             sglang-0
Namespace:        inference
Containers:
  sglang:
    Image:          lmsysorg/sglang:v0.5.2-rocm630
    Limits:
      amd.com/gpu:    8
      cpu:            96
      hugepages-2Mi:  200Gi
      memory:         1Ti
    Requests:
      amd.com/gpu:    8
      cpu:            96
      hugepages-2Mi:  200Gi
      memory:         1Ti
    Environment:
      SGLANG_HICACHE_HOST_HUGEPAGE:  1
"""

# a pod spec without a hugepages limit: Kubernetes gives it a hugetlb limit of 0
POD_SPEC = """\
    resources:
      limits:
        cpu: "96"
        memory: 512Gi
      requests:
        cpu: "96"
    volumeMounts:
"""


def test_kubectl_describe_pod_limits() -> None:
    m, f = facts_of(DESCRIBE_POD + GREP_I_HUGE)
    assert m.hugetlb_cgroup_max == {2 * M: 200 * G} and m.memcg_max == 1 << 40
    assert values(f)["sys/fs/cgroup/hugetlb.2MB.max"] == str(200 * G)
    assert "pod-no-hugepages" not in codes(f) and "limits-assumed" not in codes(f)


def test_a_pod_spec_without_a_hugepages_limit_has_a_zero_hugetlb_limit() -> None:
    m, f = facts_of(POD_SPEC + GREP_I_HUGE)
    assert m.hugetlb_cgroup_max == {2 * M: 0} and m.memcg_max == 512 * G
    assert (
        "the pod's limits on line 2 name no hugepages-<size>: Kubernetes sets its hugetlb "
        "limits to 0, so a hugepage fault in it is a SIGBUS (resources.limits.hugepages-2Mi in "
        "the pod spec sets one)"
    ) in f.notes


def test_pod_limits_cut_by_the_paste_say_nothing_of_hugepages() -> None:
    m, f = facts_of(GREP_I_HUGE + "    Limits:\n      cpu:            96\n")
    assert m.hugetlb_cgroup_max == {} and "pod-limits-cut" in codes(f)


def test_a_value_the_readers_refuse_names_its_paste_line() -> None:
    with pytest.raises(DumpError) as e:
        load_dump(b"HugePages_Total: 4\nvm.overcommit_ratio = 99999999999\n")
    assert str(e.value) == "<bytes>:2: 99999999999 does not fit the kernel's int"


def test_an_unknown_kernel_that_changes_the_answer_is_simulated_on_both_sides(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    paste = tmp_path / "ticket.txt"
    paste.write_text(GREP_I_HUGE)
    assert main(["replay", str(paste), "--size", "1GiB", "--backing", "shm-hugetlb", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["outcome"] == "ok"  # on the recent kernel assumed
    sides = [c for c in doc["causes"] if c.startswith("if the kernel is older than")]
    assert sides == [
        "if the kernel is older than 4.14 (before memfd_create's MFD_HUGETLB; the paste does not "
        "say, simulated on 4.13.0): demoted: AnonymousShm (4 KiB pages); `uname -r` settles it",
        "if the kernel is older than 3.17 (before memfd_create; the paste does not say, simulated "
        "on 3.16.0): failed: RuntimeError: UMBPHostMemAllocator.alloc(1073741824 bytes) failed "
        "(requested_backing=UMBPHostBufferBacking.AnonymousShmHugetlb, numa_node=-1).; "
        "`uname -r` settles it",
    ]
    # a request no kernel edge changes, or a paste that gives its kernel: one side only
    assert main(["replay", str(paste), "--size", "1GiB", "--json"]) == 0
    assert not any("older than" in c for c in json.loads(capsys.readouterr().out)["causes"])
    paste.write_text(UNAME + GREP_I_HUGE)
    assert main(["replay", str(paste), "--size", "1GiB", "--backing", "shm-hugetlb", "--json"]) == 0
    assert not any("older than" in c for c in json.loads(capsys.readouterr().out)["causes"])


def test_a_node_list_beyond_the_kernels_limit_is_one_error() -> None:
    with pytest.raises(DumpError) as e:
        load_dump(b"available: 2 nodes (0-99999999)\nHugePages_Total: 1\n")
    assert str(e.value) == "<bytes>:1: node id '99999999' >= 1024"


def test_tables_of_a_host_without_numa() -> None:
    """DPDK's and SPDK's tables where /sys/devices/system/node is absent: the global pool."""
    dpdk = "Pages Size Total\n512   2Mb    1Gb\n\nHugepages mounted on /dev/hugepages\n"
    m, _ = facts_of(dpdk)
    assert m.pool_total(2 * M) == 512
    spdk = "Hugepages\nnode     hugesize     free /  total\n-            2048      300 /    512\n"
    m, _ = facts_of(spdk)
    assert (m.pool_total(2 * M), m.pool_free(2 * M)) == (512, 300)


def test_a_cat_prompt_gives_one_value_only() -> None:
    m, f = facts_of("$ cat /proc/sys/vm/nr_hugepages\n1024\n512\n")
    assert values(f)["proc/sys/vm/nr_hugepages"] == "1024"
    assert [(u.line, u.text) for u in f.paste_unread] == [(3, "512")]


def test_a_figure_the_paste_does_not_show_is_never_what_the_dump_shows(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """The unreproduced-line search names Committed_AS and overcommit_memory; a grep'd paste
    gives neither: the causes say so instead of "the dump shows 0"."""
    from umbp_sim.cli import main

    paste = tmp_path / "ticket.txt"
    paste.write_text(
        "$ grep -i huge /proc/meminfo\nHugePages_Total:    8192\nHugePages_Free:     8192\n"
        "HugePages_Rsvd:        0\nHugePages_Surp:        0\nHugepagesize:       2048 kB\n"
        "$ numactl -H\navailable: 2 nodes (0-1)\nnode 0 cpus: 0 1\nnode 0 size: 64000 MB\n"
        "node 0 free: 60000 MB\nnode 1 cpus: 2 3\nnode 1 size: 64000 MB\n"
        "node 1 free: 61000 MB\n"
    )
    line = ("RuntimeError: UMBPHostMemAllocator.alloc(20006830080 bytes) failed "
            "(requested_backing=UMBPHostBufferBacking.AnonymousHugetlb, numa_node=1).")  # fmt: skip
    assert main(["replay", str(paste), "--error", line]) == 0
    out = capsys.readouterr().out
    assert "the dump shows" not in out
    assert "(Committed_AS; the paste does not show it: taken as 0)" in out
    assert "(the paste does not show it: taken as 0)" in out
