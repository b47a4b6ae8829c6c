"""Standard input (issue 19): a bare meminfo or a dump tarball as ``replay -`` / ``preflight
--root -``; a whole pasted traceback for ``--error -``; never both from stdin."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from umbp_sim.cli import main
from umbp_sim.dump import load_dump

D = Path(__file__).parent / "data" / "replay"
MEMINFO = (D / "report1-7.05GB" / "proc" / "meminfo").read_bytes()
LINE = (
    "RuntimeError: UMBPHostMemAllocator.alloc(1073741824 bytes) failed "
    "(requested_backing=UMBPHostBufferBacking.AnonymousHugetlb, numa_node=-1)."
)
# the whole paste: log lines before, the traceback, the line somewhere inside, lines after
TRACEBACK = (
    "[2026-11-30 03:12:09 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
    '  File "sglang/srt/managers/scheduler.py", line 2741, in run_scheduler_process\n'
    "    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, dp_rank)\n"
    '  File "sglang/srt/mem_cache/memory_pool_host.py", line 160, in __init__\n'
    "    self.kv_buffer = self.init_kv_buffer()\n"
    '  File "sglang/srt/mem_cache/storage/umbp/umbp_host_allocator.py", line 86, in allocate\n'
    "    raise RuntimeError(\n"
    f"{LINE}\n"
    "\n"
    "[2026-11-30 03:12:09] Received sigquit from a child process. It usually means the child "
    "failed.\n"
    "Killed\n"
)


def stdin_bytes(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))


def test_bare_meminfo_on_stdin_is_the_same_host_as_the_file(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stdin_bytes(monkeypatch, MEMINFO)
    assert main(["replay", "-", "--size", "1GiB", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert main(["replay", str(D / "report1-7.05GB" / "proc" / "meminfo"), "--size", "1GiB",
                 "--json"]) == 0  # fmt: skip
    ref = json.loads(capsys.readouterr().out)
    assert doc.pop("machine") == "<stdin>" and ref.pop("machine") == "meminfo"
    assert doc == ref  # everything else: the same host, the same answer


def test_a_bound_request_on_a_bare_meminfo_says_the_nodes_are_assumed(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    note = "dump note: a bare meminfo: no NUMA information (one node, node 0, in the Machine)"
    stdin_bytes(monkeypatch, MEMINFO)
    main(["replay", "-", "--size", "1GiB", "--numa-node", "1", "--json"])
    assert note in json.loads(capsys.readouterr().out)["causes"]
    stdin_bytes(monkeypatch, MEMINFO)
    main(["replay", "-", "--size", "1GiB", "--json"])  # unbound: the nodes do not matter
    assert note not in json.loads(capsys.readouterr().out)["causes"]


def test_preflight_root_from_stdin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stdin_bytes(monkeypatch, MEMINFO)
    code = main(["preflight", "--root", "-", "--size", "1GiB", "--backing", "anonymous"])
    assert code == 0, capsys.readouterr().err


def test_a_dump_tarball_on_stdin(tmp_path: Path) -> None:
    import tarfile

    tgz = tmp_path / "h.tar.gz"
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(D / "pool-on-node0-6.8.0", arcname="h")
    cmd = [sys.executable, "-P", "-m", "umbp_sim.cli", "replay", "--size", "1GiB", "--json"]
    proc = subprocess.run([*cmd, "-"], input=tgz.read_bytes(), capture_output=True)
    assert proc.returncode == 0, proc.stderr
    ref = subprocess.run([*cmd, str(tgz)], capture_output=True)
    doc, want = json.loads(proc.stdout), json.loads(ref.stdout)
    assert doc.pop("machine") == want.pop("machine") == "h"
    assert doc == want
    assert load_dump(tgz)[0].node_ids() == [0, 1]


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "<stdin>: empty: expected a meminfo file or a dump tarball on standard input"),
        (b"MemTotal: lots\n", "<stdin>:1: cannot read value 'lots' for MemTotal"),
    ],
)
def test_bad_stdin_is_one_line_exit_65(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, data: bytes, message: str
) -> None:
    stdin_bytes(monkeypatch, data)
    assert main(["replay", "-", "--size", "1GiB"]) == 65
    assert capsys.readouterr().err == f"umbp-sim replay: {message}\n"


def test_pasted_traceback_with_the_line_inside(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stdin_bytes(monkeypatch, TRACEBACK.encode())
    assert main(["replay", str(D / "pool-on-node0-6.8.0"), "--error", "-", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["request"].startswith("alloc(1073741824 bytes, backing AnonymousHugetlb,")


def test_a_paste_of_several_different_failures_asks_which(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    other = LINE.replace("1073741824", "2147483648").replace("numa_node=-1", "numa_node=1")
    stdin_bytes(monkeypatch, (TRACEBACK + TRACEBACK.replace(LINE, other)).encode())
    assert main(["replay", str(D / "pool-on-node0-6.8.0"), "--error", "-"]) == 64
    assert capsys.readouterr().err == (
        "umbp-sim replay: --error - (stdin): 2 different failed allocations in it "
        "(alloc(1073741824 bytes) AnonymousHugetlb node -1; alloc(2147483648 bytes) "
        "AnonymousHugetlb node 1): give the one to replay\n"
    )
    stdin_bytes(monkeypatch, (TRACEBACK + TRACEBACK).encode())  # the same one twice: fine
    assert main(["replay", str(D / "pool-on-node0-6.8.0"), "--error", "-", "--json"]) == 0
    capsys.readouterr()


def test_pasted_traceback_hard_wrapped_by_the_terminal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    wrapped = "\n".join(LINE[i : i + 80] for i in range(0, len(LINE), 80))
    stdin_bytes(monkeypatch, TRACEBACK.replace(LINE, wrapped).encode())
    assert main(["replay", str(D / "pool-on-node0-6.8.0"), "--error", "-", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["request"].startswith("alloc(1073741824 bytes, backing AnonymousHugetlb,")


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["replay", "-", "--error", "-"],
            "DUMP - and --error -: standard input holds one of them, not both; give the error "
            "line itself (--error 'RuntimeError: UMBPHostMemAllocator.alloc(...') or the dump "
            "as a file",
        ),
        (
            ["preflight", "--root", "-", "--error", "-"],
            "--root - and --error -: standard input holds one of them, not both; give the error "
            "line itself (--error 'RuntimeError: UMBPHostMemAllocator.alloc(...') or the dump "
            "as a file",
        ),
        (
            ["replay", "-", str(D / "no-pool-512g"), "--size", "1GiB"],
            "DUMP -: standard input is one dump; replay it alone, or save it to a file to replay "
            "it with the others",
        ),
    ],
)
def test_stdin_for_two_things_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str],
    message: str,
) -> None:  # fmt: skip
    stdin_bytes(monkeypatch, MEMINFO)
    assert main(argv) == 64
    cmd = argv[0]
    assert capsys.readouterr().err == f"umbp-sim {cmd}: {message}\n"
    assert sys.stdin.read() == MEMINFO.decode()  # refused before anything was read
