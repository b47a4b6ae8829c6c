"""sosreport archives (issue 19), built here from a fixture in sos's layout: the files where sos
puts them (``sosreport-HOST-.../proc/meminfo``, ``sys/...``), sos_commands/ output for what
proc/sys lacks, top-level symlinks into sos_commands, and the logs and configuration sos adds."""

from __future__ import annotations

import functools
import io
import tarfile
from pathlib import Path

import pytest
from test_dump_fixtures import DATA, FIXTURES, M

from umbp_sim.dump import DumpError, load_dump
from umbp_sim.dump.source import relevant

FIXTURE = "32intel64-2p8co2t+8ve"
TOP = "sosreport-gpu07-01234567-2026-11-30-qwerty"
SYSCTL = (
    "abi.vsyscall32 = 1\n"
    "kernel.osrelease = 5.14.0-427.13.1.el9_4.x86_64\n"
    "kernel.ostype = Linux\n"
    "net.ipv4.tcp_rmem = 4096\t131072\t6291456\n"
    "vm.min_free_kbytes = 90112\n"
    "vm.nr_hugepages = 4096\n"
    "vm.nr_overcommit_hugepages = 0\n"
    "vm.overcommit_kbytes = 0\n"
    "vm.overcommit_memory = 2\n"
    "vm.overcommit_ratio = 80\n"
    "vm.swappiness = 30\n"
)
UNAME = "Linux gpu07 5.14.0-427.13.1.el9_4.x86_64 #1 SMP PREEMPT_DYNAMIC x86_64 GNU/Linux\n"


@functools.cache
def fixture_files() -> dict[str, bytes]:
    """The fixture's files a parser may read, but its osrelease, proc/version and sysctls."""
    files: dict[str, bytes] = {}
    with tarfile.open(DATA / f"{FIXTURE}.tar.bz2") as tar:
        for m in tar.getmembers():
            rel = m.name.partition("/")[2]
            if not (m.isfile() and relevant(rel)) or rel.startswith("proc/sys/"):
                continue
            if rel != "proc/version":
                files[rel] = tar.extractfile(m).read()  # type: ignore[union-attr]
    return files


def sos_files(sysctl: str = SYSCTL, proc_meminfo: bool = True) -> dict[str, bytes]:
    """The fixture's proc/sys files (without its osrelease, proc/version or vm sysctls) under
    sos's top directory, plus what sos writes beside them."""
    files = dict(fixture_files())
    if not proc_meminfo:
        del files["proc/meminfo"]
    files |= {
        "sos_commands/kernel/sysctl_-a": sysctl.encode(),
        "sos_commands/kernel/uname_-a": UNAME.encode(),
        "sos_commands/host/hostname": b"gpu07\n",
        "sos_commands/memory/free": b"              total        used        free\nMem: 1 2 3\n",
        "sos_commands/numa/numactl_--hardware": b"available: 2 nodes (0-1)\n",
        "sos_logs/sos.log": b"2026-11-30 03:30:01,000 INFO: [sos.report] executing 'sos report'\n",
        "sos_reports/manifest.json": b'{"version": "4.7.1", "components": {}}\n',
        "version.txt": b"sosreport: 4.7.1\n",
        "etc/sysctl.conf": b"vm.nr_hugepages = 4096\n",
        "var/log/messages": b"Nov 30 03:12:09 gpu07 kernel: python3 invoked oom-killer\n" * 50,
    }
    return files


def sos_tar(files: dict[str, bytes], mode: str = "w:xz") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:
        for d in (TOP, f"{TOP}/sos_commands"):
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for rel, data in sorted(files.items()):
            info = tarfile.TarInfo(f"{TOP}/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for link, target in (("uname", "sos_commands/kernel/uname_-a"),
                             ("hostname", "sos_commands/host/hostname"),
                             ("free", "sos_commands/memory/free")):  # fmt: skip
            info = tarfile.TarInfo(f"{TOP}/{link}")
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buf.getvalue()


def check_fixture_figures(machine, facts) -> None:  # type: ignore[no-untyped-def]
    exp = FIXTURES[FIXTURE]
    assert [n.mem_total for n in facts.nodes] == [exp["nodes"][i] * 1024 for i in (0, 1)]
    assert machine.pool_total(2 * M) == 4096
    assert [n.hugepages[2 * M].total for n in machine.nodes] == [2048, 2048]
    assert facts.name == "gpu07"
    assert machine.overcommit_memory == 2 and machine.overcommit_ratio == 80


def test_sosreport_tar_xz_is_read_as_it_is(tmp_path: Path) -> None:
    p = tmp_path / f"{TOP}.tar.xz"
    p.write_bytes(sos_tar(sos_files()))
    machine, facts = load_dump(p)
    check_fixture_figures(machine, facts)
    assert facts.mem_total == FIXTURES[FIXTURE]["mem_total_kb"] * 1024
    assert machine.kernel_version == "5.14.0-427.13.1.el9_4.x86_64"
    assert facts.kernel_version_source == "osrelease"
    assert "proc/sys/vm: from sos_commands/kernel/sysctl_-a (vm.* lines)" in facts.notes
    assert "kernel release from sos_commands/kernel/sysctl_-a (kernel.osrelease)" in facts.notes
    assert facts.watermark_low == 90112 * 1024 * 5 // 4  # vm.min_free_kbytes from sysctl_-a


def test_directory_sosreport_is_the_same_machine(tmp_path: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(sos_tar(sos_files()))) as tar:
        tar.extractall(tmp_path, filter="data")
    machine, facts = load_dump(tmp_path / TOP)
    ref, _ = load_dump(sos_tar(sos_files()))
    assert machine == ref
    assert "kernel release from sos_commands/kernel/sysctl_-a (kernel.osrelease)" in facts.notes


def test_release_from_uname_when_sysctl_lacks_it() -> None:
    sysctl = SYSCTL.replace("kernel.osrelease = 5.14.0-427.13.1.el9_4.x86_64\n", "")
    machine, facts = load_dump(sos_tar(sos_files(sysctl), "w:gz"))
    assert machine.kernel_version == "5.14.0-427.13.1.el9_4.x86_64"
    assert "kernel release from sos_commands/kernel/uname_-a" in facts.notes


def test_sosreport_without_the_memory_plugin_is_built_from_the_nodes() -> None:
    machine, facts = load_dump(sos_tar(sos_files(proc_meminfo=False)))
    check_fixture_figures(machine, facts)
    exp = FIXTURES[FIXTURE]
    assert facts.mem_total == sum(exp["nodes"].values()) * 1024
    assert facts.meminfo_source == "nodes"
    assert facts.notes[0].startswith("no proc/meminfo: MemTotal ")


def test_a_bad_sysctl_value_names_the_sos_file_and_line() -> None:
    sysctl = SYSCTL.replace("vm.overcommit_memory = 2", "vm.overcommit_memory = 7")
    with pytest.raises(DumpError) as e:
        load_dump(sos_tar(sos_files(sysctl)))
    assert str(e.value) == f"<bytes>:{TOP}/sos_commands/kernel/sysctl_-a:9:1: 7 is not 0, 1 or 2"
