"""``umbp-sim collect``: a dump of this host that ``load_machine`` reads back as this host."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from fake_dumps import CGROUP_V2_HOST, write_tree

from umbp_sim import cli
from umbp_sim.dump import load_dump, parse_meminfo
from umbp_sim.live_dump import CollectError, collect

NODE = "/sys/devices/system/node"


def live_int(path: str) -> int:
    with open(path) as f:
        return int(f.read())


def test_round_trip_describes_this_host(tmp_path: Path, pools_still: None) -> None:
    # pools_still: another tier's test may change a pool between the dump and the reads below
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
    # the architecture and page size are recorded, and the reader takes them (issue 28)
    assert manifest["machine"] == os.uname().machine
    assert manifest["page_size"] == os.sysconf("SC_PAGESIZE") == machine.page_size
    (arch_note,) = [n for n in facts.notes if n.startswith("page size")]
    assert f"uname -m '{os.uname().machine}' and page size" in arch_note


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
    manifest = json.loads(tarfile.open(out).extractfile("fake/umbp-sim-collect.json").read())  # type: ignore[union-attr]
    assert "machine" not in manifest and "page_size" not in manifest  # not this host's tree


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


# ---- -o never replaces anything but a regular file (issue 26, point 1) ----------------------

REFUSED = "not a regular file: refused (-o - writes to stdout)"


def special_target(tmp_path: Path, kind: str) -> tuple[Path, str]:
    """A path in tmp_path that is ``kind``, and the word the refusal names it with."""
    path = tmp_path / f"{kind}.tar.gz"
    if kind == "fifo":
        os.mkfifo(path)
        return path, "a FIFO"
    if kind == "symlink":
        (tmp_path / "target").write_text("kept\n")
        path.symlink_to(tmp_path / "target")
        return path, "a symbolic link"
    if kind == "dangling":
        path.symlink_to(tmp_path / "nowhere")
        return path, "a symbolic link"
    if kind == "directory":
        path.mkdir()
        return path, "a directory"
    if kind == "socket":
        import socket

        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(path))
        return path, "a socket"
    assert kind == "chardev"
    return char_device(tmp_path), "a character device"


def char_device(tmp_path: Path) -> Path:
    """A character device a regression cannot harm: a fresh /dev/null node in tmp_path (root),
    else /dev/null itself, which only when /dev cannot be written (a rename over it fails)."""
    node = tmp_path / "null"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        return node
    except OSError:
        if os.access("/dev", os.W_OK):
            pytest.skip("no mknod here and /dev is writable: no safe character device")
        return Path("/dev/null")


def kind_of(path: Path) -> tuple[int, str | None]:
    st = os.lstat(path)
    return stat.S_IFMT(st.st_mode), (os.readlink(path) if stat.S_ISLNK(st.st_mode) else None)


@pytest.mark.parametrize("kind", ["fifo", "symlink", "dangling", "directory", "socket", "chardev"])
def test_output_that_is_not_a_regular_file_is_refused_before_collecting(
    tmp_path: Path,
    kind: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from umbp_sim.collect_scripts import standalone_collect as standalone

    out, what = special_target(tmp_path, kind)
    before = kind_of(out)
    entries = sorted(os.listdir(tmp_path))

    def no_collecting(*args: object) -> None:
        raise AssertionError("collected before the output was checked")

    monkeypatch.setattr(standalone, "collect_host", no_collecting)
    assert cli.main(["collect", "-o", str(out)]) == 73
    assert capsys.readouterr().err == f"umbp-sim collect: -o {out}: {what}, {REFUSED}\n"
    assert kind_of(out) == before
    assert sorted(os.listdir(tmp_path)) == entries  # no temporary file left beside it
    if kind == "symlink":
        assert (tmp_path / "target").read_text() == "kept\n"
    if kind == "dangling":
        assert not (tmp_path / "nowhere").exists()


def test_an_existing_regular_file_is_replaced_atomically(tmp_path: Path) -> None:
    out = tmp_path / "host.tar"
    out.write_text("old\n")
    other = tmp_path / "other-link"
    os.link(out, other)  # a second name of the old file keeps the old content
    assert cli.main(["collect", "-o", str(out), "--name", "h"]) == 0
    assert load_dump(out)[0].name == "h"
    assert other.read_text() == "old\n"
    assert os.stat(out).st_nlink == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["host.tar", "other-link"]


def collect_to_stdout(tmp_path: Path, stdout: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-m", "umbp_sim.cli", "collect", "-o", "-", "--name", "piped"],
        stdout=stdout, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env,
    )  # fmt: skip


def test_dash_writes_a_gzip_tarball_to_stdout(tmp_path: Path) -> None:
    out = tmp_path / "piped.tar.gz"
    with open(out, "wb") as f:
        proc = collect_to_stdout(tmp_path, f.fileno())
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("wrote the tarball to stdout: piped/, ")
    assert out.read_bytes()[:2] == b"\x1f\x8b"
    assert load_dump(out)[0].name == "piped"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["piped.tar.gz"]


def test_dash_refuses_a_terminal_stdout(tmp_path: Path) -> None:
    import pty

    leader, follower = pty.openpty()
    try:
        proc = collect_to_stdout(tmp_path, follower)
    finally:
        os.close(follower)
        os.close(leader)
    assert (proc.returncode, proc.stderr) == (
        73,
        "umbp-sim collect: -o -: stdout is a terminal; redirect it to a file "
        "(-o - > host.tar.gz)\n",
    )
