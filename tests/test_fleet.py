"""``umbp-sim replay DIR_OR_GLOB ...``: one request replayed on many dumps, a row per host."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from umbp_sim import cli
from umbp_sim.diagnose import diagnose
from umbp_sim.diagnose.error_line import parse_error_line
from umbp_sim.diagnose.fleet import (
    FleetReport,
    expand_dumps,
    is_fleet,
    render_fleet_text,
    replay_fleet,
    replay_host,
    tty_progress,
)
from umbp_sim.diagnose.replay_request import Request
from umbp_sim.dump import load_dump
from umbp_sim.errors import UmbpSimError
from umbp_sim.request import AllocRequest

DATA = Path(__file__).parent / "data"
REPLAY = DATA / "replay"
HOSTS = ("dpdk-socket0-4.18.0", "no-pool-512g", "report1-7.05GB", "pool-on-node0-6.8.0")
REQUEST = ["--size", "8GiB", "--backing", "hugetlb", "--numa-node", "0"]


def as_tar(src: Path, out: Path, name: str) -> Path:
    with tarfile.open(out, "w:gz") as tar:
        for f in sorted(src.rglob("*")):
            if f.is_file():
                data = f.read_bytes()
                info = tarfile.TarInfo(f"{name}/{f.relative_to(src)}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    """Two dump directories, two tarballs, a bare meminfo, a README that is not a dump."""
    d = tmp_path / "fleet"
    d.mkdir()
    shutil.copytree(REPLAY / HOSTS[0], d / HOSTS[0])
    shutil.copytree(REPLAY / HOSTS[1], d / HOSTS[1])
    as_tar(REPLAY / HOSTS[2], d / f"{HOSTS[2]}.tar.gz", HOSTS[2])
    as_tar(REPLAY / HOSTS[3], d / f"{HOSTS[3]}.tar.gz", HOSTS[3])
    shutil.copy(REPLAY / HOSTS[1] / "proc" / "meminfo", d / "z-bare-meminfo")
    (d / "notes.txt").write_text("not a dump\n")
    (d / "empty-dir").mkdir()
    return d


def single(path: Path) -> dict:
    m, f = load_dump(path)
    return diagnose(m, f, Request(AllocRequest(8 << 30, "AnonymousHugetlb", numa_node=0))).to_json()


def test_directory_of_dumps_a_row_per_host_in_order(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["replay", str(fleet), *REQUEST, "--json"])
    out = json.loads(capsys.readouterr().out)
    dumps = [Path(h["dump"]).name for h in out["hosts"]]
    assert dumps == [
        HOSTS[0],
        HOSTS[1],
        f"{HOSTS[3]}.tar.gz",
        f"{HOSTS[2]}.tar.gz",
        "z-bare-meminfo",
    ]
    by = {Path(h["dump"]).name: h for h in out["hosts"]}
    # each row is what the single-dump replay says
    for name in dumps:
        row, d = by[name], single(fleet / name)
        assert row["outcome"].split(",")[0] == d["outcome"]
        assert row["actual_backing"] == d["actual_backing"]
        assert row["fix"] == ("; ".join(d["fixes"][0]["commands"]) if d["fixes"] else None)
        # the single replay's first cause that the run decided (not a dump note, the RDMA note)
        decided = [c for c, s in zip(d["causes"], d["cause_sources"], strict=True)
                   if s not in ("dump", "outcome")]  # fmt: skip
        assert row["cause"] == (decided[0] if decided and row["exit_code"] else None), name
    assert by[HOSTS[0]]["outcome"] == "crashed" and by[HOSTS[0]]["exit_code"] == 2
    assert by[HOSTS[0]]["cause"].startswith("the reservation is global")
    assert by[HOSTS[1]]["outcome"] == "demoted" and by[HOSTS[1]]["actual_backing"] == "Anonymous"
    assert by[HOSTS[1]]["fix"] == "sysctl -w vm.nr_overcommit_hugepages=4096"
    assert "MAP_HUGETLB" in by[HOSTS[1]]["cause"], by[HOSTS[1]]["cause"]
    ok = by[f"{HOSTS[2]}.tar.gz"]
    assert (ok["outcome"], ok["cause"], ok["fix"], ok["exit_code"]) == ("ok", None, None, 0)
    assert out["summary"] == {"ok": 1, "demoted": 3, "crashed": 1}
    assert out["exit_code"] == code == 2  # the worst host
    assert out["allocator"] == "mori-624002c"


def test_text_table_and_summary(fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["replay", str(fleet / "*.tar.gz"), str(fleet / HOSTS[1]), *REQUEST])
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0].startswith("replay of alloc(8589934592 bytes = 8GiB, backing AnonymousHugetlb")
    assert lines[0].endswith(" on 3 hosts")
    assert lines[2].split() == ["host", "dump", "outcome", "backing", "cause", "smallest", "fix"]
    assert lines[3].split()[:4] == [HOSTS[3], f"{HOSTS[3]}.tar.gz", "demoted", "Anonymous"]
    assert lines[4].split()[:4] == [HOSTS[2], f"{HOSTS[2]}.tar.gz", "ok", "AnonymousHugetlb"]
    assert lines[5].split()[:4] == [HOSTS[1], HOSTS[1], "demoted", "Anonymous"]
    assert lines[-1] == "summary: 1 ok, 2 demoted (exit 1: the worst host)"
    assert code == 1


def test_unreadable_dump_is_a_row_and_the_worst_exit(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["replay", str(fleet / "notes.txt"), str(fleet / HOSTS[1]), *REQUEST, "--json"])
    out = json.loads(capsys.readouterr().out)
    bad = out["hosts"][0]
    assert bad["outcome"] == "unreadable" and bad["exit_code"] == 65
    assert bad["error"].startswith(f"{fleet / 'notes.txt'}:1: ")
    assert out["summary"] == {"demoted": 1, "unreadable": 1}
    assert code == 65


def test_arguments_without_dumps_are_one_line(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for arg, why in (
        (str(fleet / "*.nothing"), "no file matches"),
        (str(fleet / "empty-dir"), "a directory with no dumps in it"),
        (str(fleet / "absent"), "no such file or directory"),
    ):
        code = cli.main(["replay", arg, str(fleet / HOSTS[1]), *REQUEST])
        assert code == 66
        assert capsys.readouterr().err == f"umbp-sim replay: {arg}: {why}\n"


def test_single_dump_keeps_the_single_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert not is_fleet([str(REPLAY / HOSTS[1])])
    assert is_fleet([str(REPLAY)]) and is_fleet([str(REPLAY / "*")])
    assert is_fleet([str(REPLAY / HOSTS[1]), str(REPLAY / HOSTS[2])])
    assert cli.main(["replay", str(REPLAY / HOSTS[1]), *REQUEST, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["outcome"] == "demoted"


def test_parallel_equals_serial_and_progress(fleet: Path) -> None:
    paths = expand_dumps([str(fleet), str(REPLAY)])
    assert len(paths) == 5 + len([p for p in REPLAY.iterdir() if p.is_dir()])
    request = Request(AllocRequest(8 << 30, "AnonymousHugetlb", numa_node=0))
    seen: list[tuple[int, int]] = []
    par = replay_fleet(paths, request, jobs=2, progress=lambda d, t: seen.append((d, t)))
    ser = replay_fleet(paths, request, jobs=1)
    assert [r.to_json() for r in par.rows] == [r.to_json() for r in ser.rows]
    assert seen == [(i, len(paths)) for i in range(1, len(paths) + 1)]
    assert replay_host(paths[0], request) == ser.rows[0]
    assert render_fleet_text(par) == render_fleet_text(ser)
    assert FleetReport(request).exit_code == 0


def test_progress_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    for name in ("CI", "UMBP_SIM_PROGRESS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert tty_progress(io.StringIO()) is None
    tty = Tty()
    show = tty_progress(tty)
    assert show is not None
    show(1, 4)
    assert tty.getvalue() == "\rreplay: hosts 1/4"
    show(4, 4)  # the last one is drawn, then the line erased
    assert tty.getvalue().endswith("\rreplay: hosts 4/4\r" + " " * 17 + "\r")
    monkeypatch.setenv("CI", "true")
    assert tty_progress(Tty()) is None


def test_one_extracted_dump_beside_tarballs_is_a_fleet(tmp_path: Path) -> None:
    one = tmp_path / "one"
    shutil.copytree(REPLAY / HOSTS[1], one / HOSTS[1])
    assert not is_fleet([str(one)])  # NAME/proc/meminfo alone: one dump, as `collect` unpacks
    assert expand_dumps([str(one)]) == [str(one)]
    as_tar(REPLAY / HOSTS[2], one / "other.tar.gz", HOSTS[2])
    assert is_fleet([str(one)])
    assert expand_dumps([str(one)]) == [str(one / HOSTS[1]), str(one / "other.tar.gz")]


def test_must_gather_directory_a_row_per_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Kubernetes must-gather: nodes/NODE/ two levels down, each a dump directory (proc/
    and sys/), a dump tarball beside other node files, or only nodeN/meminfo; nodes without
    machine files and the cluster's other directories are not rows."""
    image = tmp_path / "must-gather.local.5183" / "quay-io-openshift-must-gather-sha256-0a1b"
    nodes = image / "nodes"
    (image / "namespaces" / "default").mkdir(parents=True)
    (image / "timestamp").write_text("2026-11-30 03:40:00\n")
    shutil.copytree(REPLAY / HOSTS[0], nodes / "worker-0")
    (nodes / "worker-0" / "lscpu").write_text("Architecture: x86_64\n")
    (nodes / "worker-1").mkdir()
    as_tar(REPLAY / HOSTS[1], nodes / "worker-1" / "sysinfo.tgz", "sysinfo")
    (nodes / "worker-1" / "dmesg").write_text("[0.0] Linux version\n")
    shutil.copytree(REPLAY / HOSTS[3] / "sys", nodes / "worker-2" / "sys")  # no proc/meminfo
    (nodes / "worker-3").mkdir()
    (nodes / "worker-3" / "proc_cmdline").write_text("BOOT_IMAGE=/vmlinuz\n")
    root = tmp_path / "must-gather.local.5183"
    assert expand_dumps([str(root)]) == [
        str(nodes / "worker-0"),
        str(nodes / "worker-1" / "sysinfo.tgz"),
        str(nodes / "worker-2"),
    ]
    code = cli.main(["replay", str(root), *REQUEST, "--json"])
    out = json.loads(capsys.readouterr().out)
    rows = {Path(h["dump"]).relative_to(nodes).parts[0]: h for h in out["hosts"]}
    assert sorted(rows) == ["worker-0", "worker-1", "worker-2"]
    for name, host in (("worker-0", HOSTS[0]), ("worker-1", HOSTS[1])):
        assert rows[name]["outcome"].split(",")[0] == single(REPLAY / host)["outcome"]
    assert rows["worker-2"]["outcome"].split(",")[0] == single(nodes / "worker-2")["outcome"]
    assert load_dump(nodes / "worker-2")[1].meminfo_source == "nodes"
    assert code == out["exit_code"]


def test_must_gather_tarball_says_to_unpack_it(tmp_path: Path) -> None:
    out = tmp_path / "must-gather.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        for node, host in (("worker-0", HOSTS[0]), ("worker-1", HOSTS[1])):
            tar.add(REPLAY / host, arcname=f"must-gather.local.1/img-sha256-0a/nodes/{node}")
    with pytest.raises(UmbpSimError) as e:
        load_dump(out)
    assert str(e.value) == (
        f"{out}: a must-gather of 2 node dumps (must-gather.local.1/img-sha256-0a/nodes/worker-0, "
        "must-gather.local.1/img-sha256-0a/nodes/worker-1), not one dump: unpack it and replay "
        "the directory (a row per node)"
    )


# ---- links out of a fleet (issue 26, point 5) ------------------------------------------------


def test_a_link_out_of_a_fleet_directory_is_refused(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (fleet / "alias").symlink_to(HOSTS[0])  # inside the fleet: fine
    assert str(fleet / "alias") in expand_dumps([str(fleet)])
    (fleet / "rootfs").symlink_to("/")
    code = cli.main(["replay", str(fleet), *REQUEST, "--json"])
    assert (code, capsys.readouterr()) == (
        65,
        ("", f"umbp-sim replay: {fleet}/rootfs: a symbolic link out of {fleet} (to /): refused\n"),
    )
    (fleet / "rootfs").unlink()
    (fleet / "host.tar.gz").symlink_to(fleet.parent / "elsewhere.tar.gz")
    with pytest.raises(UmbpSimError) as e:
        expand_dumps([str(fleet)])
    assert str(e.value) == (
        f"{fleet}/host.tar.gz: a symbolic link out of {fleet} "
        f"(to {fleet.parent}/elsewhere.tar.gz): refused"
    )


def test_a_link_out_of_a_glob_directory_is_refused(fleet: Path) -> None:
    (fleet / "x-meminfo").symlink_to("/proc/meminfo")
    with pytest.raises(UmbpSimError) as e:
        expand_dumps([str(fleet / "*meminfo")])
    assert e.value.exit_code == 65  # type: ignore[attr-defined]
    assert str(e.value) == (
        f"{fleet}/x-meminfo: a symbolic link out of {fleet} (to /proc/meminfo): refused"
    )


def test_a_link_out_of_a_must_gather_is_refused(tmp_path: Path) -> None:
    nodes = tmp_path / "must-gather.local.1" / "img" / "nodes"
    shutil.copytree(REPLAY / HOSTS[0], nodes / "worker-0")
    (nodes / "worker-1").symlink_to("/")
    root = tmp_path / "must-gather.local.1"
    with pytest.raises(UmbpSimError) as e:
        expand_dumps([str(root)])
    assert str(e.value) == f"{nodes}/worker-1: a symbolic link out of {root} (to /): refused"
    (nodes / "worker-1").unlink()
    (nodes / "worker-1").mkdir()
    (nodes / "worker-1" / "sysinfo.tgz").symlink_to("/etc/hostname")
    with pytest.raises(UmbpSimError) as e:
        expand_dumps([str(root)])
    assert str(e.value) == (
        f"{nodes}/worker-1/sysinfo.tgz: a symbolic link out of {root} (to /etc/hostname): refused"
    )
    (nodes / "worker-1" / "sysinfo.tgz").unlink()
    (nodes / "worker-1" / "sysinfo.tgz").symlink_to("../worker-0/../../nodes/x.tgz")  # inside
    as_tar(REPLAY / HOSTS[1], nodes / "x.tgz", "x")
    inside = [str(nodes / "worker-0"), str(nodes / "worker-1" / "sysinfo.tgz")]
    assert expand_dumps([str(root)]) == inside


def test_a_demoted_old_kernel_host_names_the_pool_not_madv_populate() -> None:
    """issue 28: rows of demoted hosts before 5.14 named "older than 5.14 ... MADV_POPULATE
    EINVAL" (the last cause: it only sends mori to touch by hand); the first is the pool."""
    request = Request(AllocRequest(8 << 30, "AnonymousHugetlb", numa_node=0))
    (row,) = replay_fleet([str(DATA / "replay" / "pool-on-node0-5.10.0")], request, jobs=1).rows
    assert row.outcome == "demoted"
    assert row.cause is not None and row.cause.startswith("2048 kB pages needed: 4096;"), row.cause


def test_an_error_line_over_a_fleet_says_which_hosts_give_it(
    fleet: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """With --error each row says whether its host gives the line and, where not, the single
    replay's hypotheses for it, most likely first."""
    line = (
        "RuntimeError: UMBPHostMemAllocator.alloc(8589934592 bytes) failed "
        "(requested_backing=UMBPHostBufferBacking.AnonymousHugetlb, numa_node=0)."
    )
    page = tmp_path / "fleet.html"
    cli.main(["replay", str(fleet), "--error", line, "--json", "--html", str(page)])
    out = json.loads(capsys.readouterr().out)
    for row in out["hosts"]:
        name = Path(row["dump"]).name
        m, f = load_dump(fleet / name)
        el = parse_error_line(line)
        request = Request(AllocRequest(el.size, el.backing, numa_node=0), error_line=el)
        d = diagnose(m, f, request).to_json()
        assert row["reproduces_error_line"] is d["reproduces_error_line"] is False, name
        kinds = [h["kind"] for h in d["hypotheses"]["hypotheses"]]
        assert row["hypotheses"] == kinds and kinds[0] == "rlimit_as", name
        assert row["first_hypothesis"] == d["hypotheses"]["hypotheses"][0]["cause"]
    cli.main(["replay", str(fleet), "--error", line])
    text = capsys.readouterr().out.splitlines()
    assert text[2].split()[:5] == ["host", "dump", "outcome", "error", "line"]
    assert "not reproduced; rlimit_as" in text[3]
    assert "<th>error line</th>" in page.read_text()


def _group(pgid: int) -> list[int]:
    """The processes still in process group ``pgid``."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(pid))
    return out


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1], ids=["SIGTERM", "SIGHUP", "SIGUSR1"]
)
def test_a_signal_ends_a_fleet_replay_cleanly(tmp_path: Path, sig: int) -> None:
    """SIGTERM or SIGHUP to a fleet replay: its workers end with it, one line, 128 + the signal
    (not a death by the signal, the workers left to fail on the pool's pipes)."""
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    meminfo = (REPLAY / HOSTS[1] / "proc" / "meminfo").read_bytes()
    for i in range(1000):
        (fleet / f"host-{i:04d}-meminfo").write_bytes(meminfo)
    env = {k: v for k, v in os.environ.items() if k != "UMBP_SIM_TRACEBACK"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "umbp_sim.cli", "replay", str(fleet), *REQUEST],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    try:
        # its workers started (one CPU: no workers, the hosts one after the other)
        expected = 3 if (os.cpu_count() or 1) > 1 else 1
        deadline = time.monotonic() + 60
        while len(_group(proc.pid)) < expected and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_group(proc.pid)) >= expected and proc.poll() is None
        time.sleep(0.3 if expected > 1 else 2)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    name = signal.Signals(sig).name
    assert (proc.returncode, out) == (128 + sig, "")
    assert re.fullmatch(
        rf"umbp-sim replay: terminated by {name} after \d+ of 1000 hosts \(no report\)\n", err
    ), err
    deadline = time.monotonic() + 5
    while _group(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _group(proc.pid) == []
