"""Files left in hugetlbfs mounts: the collectors list them with the kB each holds
(umbp-sim-hugetlbfs.tsv, collect_scripts/standalone_collect.py's HUGETLBFS), and the dump reader
names them and their fix in a note (umbp_sim/dump/read_system.py) that the replay shows."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import isolated_child_env
from fake_dumps import write_tree

from umbp_sim.cli import main
from umbp_sim.collect_scripts import script_text
from umbp_sim.dump import load_dump
from umbp_sim.live_dump import collect

MiB = 1 << 20
HOST = {
    "proc/meminfo": (
        "MemTotal: 67108864 kB\nMemFree: 60000000 kB\nMemAvailable: 60000000 kB\n"
        "HugePages_Total: 1024\nHugePages_Free: 1000\nHugePages_Rsvd: 0\nHugePages_Surp: 0\n"
        "Hugepagesize: 2048 kB\n"
    ),
    "proc/sys/kernel/osrelease": "6.8.0\n",
    "proc/self/mountinfo": (
        "25 1 0:22 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
        "40 25 0:45 / /dev/hugepages rw,relatime shared:22 - hugetlbfs hugetlbfs rw,pagesize=2M\n"
        "41 25 0:46 / /mnt/huge1g rw - hugetlbfs nodev rw,pagesize=1024M\n"
    ),
    "dev/hugepages/notes/readme": "a directory: not listed\n",
}
EXPECTED = "/dev/hugepages\t2M\trtemap_0\t8\n/dev/hugepages\t2M\trtemap_1\t8\n"


def _root(tmp_path: Path) -> Path:
    root = write_tree(tmp_path / "root", HOST)
    for name in ("rtemap_1", "rtemap_0"):
        (root / "dev/hugepages" / name).write_bytes(b"\1" * 8192)  # 8 kB allocated
    (root / "mnt/huge1g").mkdir(parents=True)  # a mount with no files: nothing listed
    return root


def _tsv(path: Path, name: str) -> str:
    with tarfile.open(path) as tar:
        f = tar.extractfile(f"{name}/umbp-sim-hugetlbfs.tsv")
        assert f is not None
        return f.read().decode()


@pytest.mark.parametrize("kind", ["collect", "py", "sh"])
def test_each_collector_lists_the_files_in_hugetlbfs_mounts(tmp_path: Path, kind: str) -> None:
    root = _root(tmp_path)
    out = tmp_path / "host.tar"
    if kind == "collect":
        collect(str(out), "host", root=str(root))
    else:
        script = tmp_path / f"collect.{kind}"
        script.write_text(script_text(kind))
        cmd = [sys.executable, "-I", "-S", str(script)] if kind == "py" else ["dash", str(script)]
        proc = subprocess.run([*cmd, "-o", str(out), "--name", "host", "--root", str(root)],
                              capture_output=True, text=True, env=isolated_child_env())  # fmt: skip
        assert proc.returncode == 0, proc.stderr
    assert _tsv(out, "host") == EXPECTED
    _, facts = load_dump(str(out))
    assert facts.hugetlbfs_held == {2 * MiB: 2}
    assert [str(n) for n in facts.notes if n.code == "hugetlbfs-files"] == [
        "2 file(s) left in hugetlbfs mounts hold 2 of 2048 kB pages (/dev/hugepages/rtemap_0, "
        "/dev/hugepages/rtemap_1): in use with no process needing to map them, so "
        "HugePages_Free stays low; remove those no running process uses (rm "
        "/dev/hugepages/rtemap_*, ...) or reboot"
    ]


def test_the_replay_names_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "host.tar"
    collect(str(out), "host", root=str(_root(tmp_path)))
    assert main(["replay", str(out), "--size", "4GiB", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "hugetlbfs-files" in doc["cause_note_codes"]


def test_a_malformed_listing_is_one_line_naming_it(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    dump = write_tree(tmp_path / "d", {**HOST, "umbp-sim-hugetlbfs.tsv": "/dev/hugepages\tx\n"})
    code = main(["replay", str(dump), "--size", "1GiB"])
    err = capsys.readouterr().err
    assert code == 65
    assert "umbp-sim-hugetlbfs.tsv" in err and "expected MOUNT, PAGESIZE, NAME, KB" in err
    assert err.count("\n") == 1
