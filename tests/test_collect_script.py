"""The stand-alone collectors (``umbp-sim collect --script py|sh``): the same dump as collect.

Run as a host without umbp-sim would: ``python3 -I -S collect.py`` (no site packages) and
``dash collect.sh`` (Debian's /bin/sh).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import resource
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest
from conftest import isolated_child_env
from fake_dumps import CGROUP_V2_HOST, write_tree

from umbp_sim import cli
from umbp_sim.collect_scripts import script_text
from umbp_sim.dump import load_dump
from umbp_sim.live_dump import collect
from umbp_sim.machine import Machine

KINDS = ("py", "sh")


def script(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"collect.{kind}"
    path.write_text(script_text(kind))
    return path


def run_script(tmp_path: Path, kind: str, *args: str) -> subprocess.CompletedProcess[str]:
    path = script(tmp_path, kind)
    cmd = [sys.executable, "-I", "-S", str(path)] if kind == "py" else ["dash", str(path)]
    return subprocess.run(
        [*cmd, *args], capture_output=True, text=True, cwd=tmp_path, env=isolated_child_env()
    )


def steady(m: Machine) -> Machine:
    """The machine without the figures that move between two collections (free memory, the
    page cache and reclaimable slab)."""
    nodes = [
        dataclasses.replace(n, mem_free=None, page_cache=None, slab_reclaimable=None)
        for n in m.nodes
    ]
    return dataclasses.replace(
        m, nodes=nodes, mem_free=None, mem_available=None, committed_as=0, name="x",
        page_cache=0, slab_reclaimable=0,
    )  # fmt: skip


def manifest(path: Path) -> dict:
    with tarfile.open(path) as tar:
        member = next(n for n in tar.getnames() if n.endswith("/umbp-sim-collect.json"))
        return json.load(tar.extractfile(member))  # type: ignore[arg-type]


def test_cli_prints_the_shipped_scripts(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["collect", "--script"]) == 0
    py = capsys.readouterr().out
    assert py == script_text("py") and py.startswith("#!/usr/bin/env python3\n")
    assert cli.main(["collect", "--script", "sh"]) == 0
    sh = capsys.readouterr().out
    assert sh == script_text("sh") and sh.startswith("#!/bin/sh\n")
    # the python collector imports the standard library only (it runs where umbp-sim is not)
    imported = set()
    for node in ast.walk(ast.parse(py)):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported and imported <= set(sys.stdlib_module_names)
    with pytest.raises(SystemExit) as ei:
        cli.main(["collect", "--script", "bash"])
    assert ei.value.code == 64
    assert "argument --script: invalid choice: 'bash'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as ei:
        cli.main(["collect"])
    assert ei.value.code == 64
    assert capsys.readouterr().err.endswith(
        "umbp-sim collect: error: the following arguments are required: -o/--output (or --script)\n"
    )


@pytest.mark.parametrize("kind", KINDS)
def test_script_dump_is_the_same_machine_as_collect(
    tmp_path: Path, kind: str, pools_still: None
) -> None:
    # pools_still: other tests' pools stay as they are between the two collections
    ref = tmp_path / "ref.tar.gz"
    res = collect(str(ref), "here")
    out = tmp_path / "script.tar.gz"
    proc = run_script(tmp_path, kind, "-o", str(out), "--name", "here")
    assert proc.returncode == 0, proc.stderr
    m = manifest(out)
    assert proc.stderr == (
        f"wrote {out}: here/, {len(m['collected'])} files, {len(m['missing'])} missing "
        "(listed in here/umbp-sim-collect.json)\n"
    )
    machine, facts = load_dump(out)
    ref_machine, ref_facts = load_dump(ref)
    assert steady(machine) == steady(ref_machine)
    assert facts.rlimit_as == ref_facts.rlimit_as and facts.memcg_max == ref_facts.memcg_max
    assert facts.mem_total == ref_facts.mem_total
    # the same files, the same gaps, the same notes; plus what was left out
    assert m["collected"] == sorted(res.collected)
    assert m["missing"] == dict(sorted(res.missing.items()))
    assert m["notes"] == res.notes
    assert m["tool"] == f"umbp-sim collect.{kind}" and m["pid"] is None
    assert (m["machine"], m["page_size"]) == (os.uname().machine, os.sysconf("SC_PAGESIZE"))
    assert (machine.arch, machine.page_size) == (ref_machine.arch, ref_machine.page_size)
    assert m["left_out"] == [
        "environment variables (/proc/*/environ): never read",
        "command lines (/proc/*/cmdline): never read",
    ]
    with tarfile.open(out) as tar:
        names = tar.getnames()
    assert all(n == "here" or n.startswith("here/") for n in names)
    for rel in m["collected"]:
        assert f"here/{rel}" in names


@pytest.mark.parametrize("kind", KINDS)
def test_pid_records_what_the_server_saw_and_no_secrets(tmp_path: Path, kind: str) -> None:
    secret_env, secret_arg = "UMBP_SECRET_TOKEN_4242", "umbp-secret-argument-7777"

    def limit_as() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))

    wait = "import sys, time; print('up', flush=True); time.sleep(60)"
    server = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", wait, secret_arg],
        env={"PATH": os.environ["PATH"], "SECRET": secret_env},
        preexec_fn=limit_as,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None and server.stdout.readline() == "up\n"
        out = tmp_path / "server.tar"
        proc = run_script(tmp_path, kind, "-o", str(out), "--name", "srv", "--pid", str(server.pid))
        assert proc.returncode == 0, proc.stderr
        machine, facts = load_dump(out)
        blob = out.read_bytes()
        with tarfile.open(out) as tar:
            status = tar.extractfile(f"srv/proc/{server.pid}/status").read().decode()  # type: ignore[union-attr]
            numa = tar.extractfile(f"srv/proc/{server.pid}/numa_maps").read().decode()  # type: ignore[union-attr]
            cgroup = tar.extractfile(f"srv/proc/{server.pid}/cgroup").read().decode()  # type: ignore[union-attr]
        live_status = Path(f"/proc/{server.pid}/status").read_text()
        live_cgroup = Path(f"/proc/{server.pid}/cgroup").read_text()
    finally:
        server.kill()
        server.wait()
        server.stdout.close()  # type: ignore[union-attr]
    assert machine.rlimit_as == 8 << 30 and facts.rlimit_as == 8 << 30  # the server's limit
    # Its credentials: the effective uid, and CAP_SYS_ADMIN (bit 21) of CapEff as root.
    live = dict(ln.split(":", 1) for ln in live_status.splitlines() if ":" in ln)
    assert facts.uid == int(live["Uid"].split()[1]) == os.geteuid()
    assert machine.root is bool(int(live["CapEff"], 16) >> 21 & 1)
    assert secret_env.encode() not in blob and secret_arg.encode() not in blob
    assert b"file=" not in blob
    assert cgroup == live_cgroup
    mems = [
        ln for ln in live_status.splitlines() if ln.startswith(("Mems_allowed", "Cpus_allowed"))
    ]
    assert status.splitlines() == mems and any(ln.startswith("Mems_allowed:") for ln in mems)
    assert numa and all(len(line.split()) >= 2 for line in numa.splitlines())
    m = manifest(out)
    assert m["pid"] == server.pid
    assert f"proc/{server.pid}/numa_maps" in m["collected"]
    assert f"proc/self/limits: from /proc/{server.pid}/limits (the server process)" in m["notes"]
    assert m["left_out"] == [
        "environment variables (/proc/*/environ): never read",
        "command lines (/proc/*/cmdline): never read",
        f"proc/{server.pid}/status: all but Mems_allowed, Mems_allowed_list, Cpus_allowed, "
        "Cpus_allowed_list, Uid, Gid, CapPrm, CapEff, CapBnd",
        f"proc/{server.pid}/numa_maps: file names",
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_fake_root_with_cgroup_v2_limits_matches_collect(tmp_path: Path, kind: str) -> None:
    root = write_tree(
        tmp_path / "root", {**CGROUP_V2_HOST, "sys/fs/cgroup/hugetlb.2MB.max": "1048576\n"}
    )
    ref = tmp_path / "ref.tar"
    res = collect(str(ref), "fake", root=str(root))
    out = tmp_path / "fake.tar"
    proc = run_script(tmp_path, kind, "-o", str(out), "--name", "fake", "--root", str(root))
    assert proc.returncode == 0, proc.stderr
    m, _ = load_dump(out)
    assert m == load_dump(ref)[0]
    assert m.memcg_max == 4 << 30  # the parent's limit binds
    assert m.hugetlb_cgroup_max == {2 << 20: 1 << 20}  # the root's is smaller
    assert m.hugetlb_cgroup_rsvd_max == {2 << 20: 4 << 20}  # rsvd.max: collected, then loaded
    man = manifest(out)
    assert "machine" not in man and "page_size" not in man  # a --root tree is not this host
    assert man["collected"] == sorted(res.collected)
    assert man["notes"] == res.notes
    assert set(man["missing"]) == set(res.missing)


@pytest.mark.parametrize("kind", KINDS)
def test_bad_usage_and_unwritable_output_are_one_line(tmp_path: Path, kind: str) -> None:
    prog = f"collect.{kind}"
    usage = f"usage: {prog} [-o FILE.tar.gz] [--name NAME] [--pid PID]\n"
    proc = run_script(tmp_path, kind, "--pid", "12x")
    assert (proc.returncode, proc.stderr) == (
        64,
        f"{prog}: --pid: '12x' is not a process id\n{usage}",
    )
    proc = run_script(tmp_path, kind, "--pid", "999999999")
    assert (proc.returncode, proc.stderr) == (
        64,
        f"{prog}: --pid 999999999: no such process\n{usage}",
    )
    proc = run_script(tmp_path, kind, "--frobnicate")
    assert (proc.returncode, proc.stderr) == (64, f"{prog}: --frobnicate: unknown option\n{usage}")
    out = tmp_path / "no" / "dir.tar.gz"
    proc = run_script(tmp_path, kind, "-o", str(out))
    assert proc.returncode == 73
    assert proc.stderr.startswith(f"{prog}: -o {out}: cannot write")
    assert len(proc.stderr.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"collect.{kind}"]


def test_umbp_sim_collect_pid_runs_the_python_collector(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in isolated_child_env().items():  # its `python -I -S` child (see there)
        monkeypatch.setenv(key, value)
    out = tmp_path / "srv.tar"
    assert cli.main(["collect", "-o", str(out), "--name", "srv", "--pid", str(os.getpid())]) == 0
    m = manifest(out)
    assert m["tool"] == "umbp-sim collect.py" and m["pid"] == os.getpid()
    assert load_dump(out)[0].name


def test_umbp_sim_collect_pid_error_is_its_own_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key, value in isolated_child_env().items():  # its `python -I -S` child (see there)
        monkeypatch.setenv(key, value)
    pid = 2**22 + 1  # above pid_max's ceiling: never a process
    assert cli.main(["collect", "-o", str(tmp_path / "x.tar"), "--pid", str(pid)]) == 64
    assert capsys.readouterr().err == f"umbp-sim collect: --pid {pid}: no such process\n"
    assert list(tmp_path.iterdir()) == []


def test_python_collector_in_process_matches_collect(tmp_path: Path, pools_still: None) -> None:
    """The same script imported as a module (what coverage sees of it); the pool lock held."""
    from umbp_sim.collect_scripts import standalone_collect as script_module

    out = tmp_path / "in.tar.xz"
    assert script_module.main(["-o", str(out), "--name=in", f"--pid={os.getpid()}"]) == 0
    ref = tmp_path / "ref.tar"
    collect(str(ref), "in")
    assert steady(load_dump(out)[0]) == steady(load_dump(ref)[0])
    assert script_module.main(["--name", "a/b"]) == 64
    assert script_module.main(["-o"]) == 64


# ---- -o never replaces anything but a regular file (issue 26, point 1) ----------------------

TARGETS = ["fifo", "symlink", "dangling", "directory", "socket", "chardev"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("kind", KINDS)
def test_output_that_is_not_a_regular_file_is_refused(
    tmp_path: Path, kind: str, target: str
) -> None:
    from test_collect import REFUSED, kind_of, special_target

    work = tmp_path / "out"
    work.mkdir()
    out, what = special_target(work, target)
    before = kind_of(out)
    entries = sorted(os.listdir(work))
    env = isolated_child_env()
    # the check comes before any work: even before the sh collector's scratch directory
    env["TMPDIR"] = str(tmp_path / "no-such-dir")
    path = script(tmp_path, kind)
    cmd = [sys.executable, "-I", "-S", str(path)] if kind == "py" else ["dash", str(path)]
    proc = subprocess.run(
        [*cmd, "-o", str(out)], capture_output=True, text=True, cwd=tmp_path, env=env
    )
    assert (proc.returncode, proc.stderr) == (73, f"collect.{kind}: -o {out}: {what}, {REFUSED}\n")
    assert kind_of(out) == before
    assert sorted(os.listdir(work)) == entries
    if target == "symlink":
        assert (work / "target").read_text() == "kept\n"
    if target == "dangling":
        assert not (work / "nowhere").exists()


def test_python_collector_checks_the_output_before_collecting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from umbp_sim.collect_scripts import standalone_collect as script_module

    def no_collecting(*args: object) -> None:
        raise AssertionError("collected before the output was checked")

    monkeypatch.setattr(script_module, "collect_host", no_collecting)
    os.mkfifo(tmp_path / "fifo")
    assert script_module.main(["-o", str(tmp_path / "fifo")]) == 73
    assert "a FIFO, not a regular file" in capsys.readouterr().err
    # and it stays python 3.6 syntax (its header: the system's python3 on old hosts)
    ast.parse(script_text("py"), feature_version=(3, 6))


@pytest.mark.parametrize("kind", KINDS)
def test_regular_file_replaced_and_dash_is_stdout(tmp_path: Path, kind: str) -> None:
    root = write_tree(tmp_path / "root", CGROUP_V2_HOST)
    out = tmp_path / "fake.tar.xz"
    out.write_text("old\n")
    os.link(out, tmp_path / "second-name")
    proc = run_script(tmp_path, kind, "-o", str(out), "--name", "fake", "--root", str(root))
    assert proc.returncode == 0, proc.stderr
    assert load_dump(out)[0].memcg_max == 4 << 30
    assert (tmp_path / "second-name").read_text() == "old\n"  # replaced, not written through
    piped = tmp_path / "piped.tar.gz"
    path = script(tmp_path, kind)
    cmd = [sys.executable, "-I", "-S", str(path)] if kind == "py" else ["dash", str(path)]
    with open(piped, "wb") as f:
        proc2 = subprocess.run(
            [*cmd, "-o", "-", "--name", "fake", "--root", str(root)],
            stdout=f, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=isolated_child_env(),
        )  # fmt: skip
    assert proc2.returncode == 0, proc2.stderr
    assert proc2.stderr.startswith("wrote the tarball to stdout: fake/, ")
    assert piped.read_bytes()[:2] == b"\x1f\x8b"  # gzip, as the default name
    assert load_dump(piped)[0] == load_dump(out)[0]
    names = {"collect." + kind, "fake.tar.xz", "piped.tar.gz", "root", "second-name"}
    assert {p.name for p in tmp_path.iterdir()} == names


@pytest.mark.parametrize("kind", KINDS)
def test_dash_refuses_a_terminal_stdout(tmp_path: Path, kind: str) -> None:
    import pty

    path = script(tmp_path, kind)
    cmd = [sys.executable, "-I", "-S", str(path)] if kind == "py" else ["dash", str(path)]
    leader, follower = pty.openpty()
    try:
        proc = subprocess.run(
            [*cmd, "-o", "-"], stdout=follower, stderr=subprocess.PIPE, text=True,
            cwd=tmp_path, env=isolated_child_env(),
        )  # fmt: skip
    finally:
        os.close(follower)
        os.close(leader)
    assert (proc.returncode, proc.stderr) == (
        73,
        f"collect.{kind}: -o -: stdout is a terminal; redirect it to a file (-o - > host.tar.gz)\n",
    )


UNPRIVILEGED = (
    "Name:\tpython3\nUid:\t1000\t1000\t1000\t1000\nGid:\t1000\t1000\t1000\t1000\n"
    "CapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t000001ffffffffff\n"
    "Mems_allowed_list:\t0-1\n"
)


@pytest.mark.parametrize("kind", KINDS)
def test_pid_records_the_servers_credentials_and_the_replay_uses_them(
    tmp_path: Path, kind: str
) -> None:
    """A server without CAP_SYS_ADMIN (a container's process): collect --pid records its Uid
    and Cap* lines as proc/self/status, the dump reads root = False, and the replay says so."""
    root = write_tree(tmp_path / "root", {**CGROUP_V2_HOST, "proc/4242/status": UNPRIVILEGED,
                                          "proc/4242/cgroup": "0::/\n"})  # fmt: skip
    out = tmp_path / "srv.tar"
    done = run_script(tmp_path, kind, "--root", str(root), "-o", str(out), "--pid", "4242")
    assert done.returncode == 0, done.stderr
    machine, facts = load_dump(out)
    assert (machine.root, facts.uid) == (False, 1000)
    assert "the server ran as uid 1000 without CAP_SYS_ADMIN and CAP_SYS_NICE" in " ".join(
        facts.notes
    )
    assert "proc/self/status: the credentials of /proc/4242/status" in manifest(out)["notes"]
    with tarfile.open(out) as tar:
        names = tar.getnames()
        kept = tar.extractfile(next(n for n in names if n.endswith("proc/self/status")))
        assert kept is not None and b"Name:" not in kept.read()  # the credential lines only
    # Without --pid nothing says who the server was: taken as privileged, in a note.
    plain = tmp_path / "plain.tar"
    assert run_script(tmp_path, kind, "--root", str(root), "-o", str(plain)).returncode == 0
    machine, facts = load_dump(plain)
    assert machine.root is True and facts.root is None
    assert any(n.code == "credentials-unknown" for n in facts.notes)


def _stat(comm: str, flags: int, start: int) -> str:
    """A /proc/PID/stat line: fields 9 (flags) and 22 (starttime) as given."""
    after = ["S", "1", "1", "1", "0", "-1", str(flags)] + ["0"] * 12 + [str(start), "0", "0"]
    return f"4242 ({comm}) " + " ".join(after) + "\n"


@pytest.mark.parametrize("kind", KINDS)
def test_pid_of_a_kernel_thread_is_refused(tmp_path: Path, kind: str) -> None:
    kthread = _stat("kworker/0:1 x)", 0x208040, 9)  # PF_KTHREAD; a ')' in its name
    root = write_tree(tmp_path / "root", {**CGROUP_V2_HOST, "proc/4242/cgroup": "0::/\n",
                                          "proc/4242/stat": kthread})  # fmt: skip
    out = tmp_path / "k.tar"
    done = run_script(tmp_path, kind, "--root", str(root), "-o", str(out), "--pid", "4242")
    assert (done.returncode, done.stderr) == (
        64,
        f"collect.{kind}: --pid 4242: a kernel thread (kworker/0:1 x)), not a process that "
        "allocates; give the server's process id\n"
        f"usage: collect.{kind} [-o FILE.tar.gz] [--name NAME] [--pid PID]\n",
    )
    assert not out.exists()


@pytest.mark.parametrize("kind", KINDS)
def test_pid_that_exits_while_collected_writes_nothing(tmp_path: Path, kind: str) -> None:
    """Its numa_maps a FIFO: while the collector reads it, the process 'exits' and another takes
    its id (another starttime): what was read is not one process's, so nothing is written."""
    server = _stat("server", 0x400100, 9)
    root = write_tree(tmp_path / "root", {**CGROUP_V2_HOST, "proc/4242/cgroup": "0::/\n",
                                          "proc/4242/stat": server})  # fmt: skip
    fifo = root / "proc/4242/numa_maps"
    os.mkfifo(fifo)
    out = tmp_path / "gone.tar"

    def exit_meanwhile() -> None:
        with open(fifo, "w") as f:  # the collector is reading it now
            (root / "proc/4242/stat").write_text(_stat("other", 0x400100, 10))
            f.write("7f0000000000 default anon=1\n")

    writer = threading.Thread(target=exit_meanwhile, daemon=True)
    writer.start()
    done = run_script(tmp_path, kind, "--root", str(root), "-o", str(out), "--pid", "4242")
    writer.join(5)
    assert (done.returncode, done.stderr) == (
        64, f"collect.{kind}: --pid 4242: the process exited while it was collected; nothing "
        "written\n",
    )  # fmt: skip
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"collect.{kind}", "root"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_numa_maps_that_cannot_be_read_is_recorded_missing(tmp_path: Path, kind: str) -> None:
    """Its numa_maps passes the collector's test for a readable file but cannot be read (here a
    directory; a process whose maps went): no tool's raw error, no empty file, the reason in
    the manifest, as for any file that cannot be read."""
    server = _stat("server", 0x400100, 9)
    root = write_tree(tmp_path / "root", {**CGROUP_V2_HOST, "proc/4242/cgroup": "0::/\n",
                                          "proc/4242/stat": server})  # fmt: skip
    (root / "proc/4242/numa_maps").mkdir()
    out = tmp_path / "srv.tar"
    done = run_script(tmp_path, kind, "--root", str(root), "-o", str(out), "--pid", "4242")
    m = manifest(out)
    assert (done.returncode, done.stderr) == (
        0, f"wrote {out}: vm/, 4 files, {len(m['missing'])} missing (listed in "
        "vm/umbp-sim-collect.json)\n",
    )  # fmt: skip
    assert m["missing"]["proc/4242/numa_maps"] == "Is a directory"
    assert "proc/4242/numa_maps" not in m["collected"]
    with tarfile.open(out) as tar:
        assert not any(n.endswith("numa_maps") for n in tar.getnames())
