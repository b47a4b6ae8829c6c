"""``umbp-sim inspect``: the JSON of issue 3, a table, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from umbp_sim import cli

DATA = Path(__file__).parent / "data" / "machines"
REQUIRED = [
    "page_size",
    "default_hugepage_size",
    "mem_total",
    "mem_available",
    "commit_limit",
    "committed_as",
    "hugepages",
    "nodes",
]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = cli.main(list(argv))
    except SystemExit as e:  # argparse
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_json_of_32intel64(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "inspect", str(DATA / "32intel64-2p8co2t+8ve.tar.bz2"), "--json")
    assert code == 0 and err == ""
    doc = json.loads(out)
    assert list(doc)[: len(REQUIRED)] == REQUIRED
    assert doc["page_size"] == 4096 and doc["default_hugepage_size"] == 2097152
    assert doc["mem_total"] == 97445600 * 1024 and doc["mem_available"] == 83337000 * 1024
    assert doc["commit_limit"] == 52917100 * 1024 and doc["committed_as"] == 1690036 * 1024
    assert doc["hugepages"] == {
        "2097152": {"total": 4096, "free": 4096, "reserved": 0, "surplus": 0},
        "1073741824": {"total": 0, "free": 0, "reserved": 0, "surplus": 0},
    }
    assert doc["nodes"][1] == {
        "id": 1,
        "mem_total": 49519964 * 1024,
        "mem_free": 10710036 * 1024,
        "hugepages": {
            "2097152": {"total": 2048, "free": 2048, "surplus": 0},
            "1073741824": {"total": 0, "free": 0, "surplus": 0},
        },
    }


def test_json_nulls_for_what_the_dump_lacks(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "inspect", str(DATA / "2i386-2c-nohugepage.tar.bz2"), "--json")
    doc = json.loads(out)
    assert code == 0
    assert doc["mem_available"] is None and doc["default_hugepage_size"] is None
    assert doc["hugepages"] == {} and doc["nodes"] == []
    assert doc["commit_limit"] == 3134184 * 1024 and doc["rlimit_as"] is None


def test_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "inspect", str(DATA / "16amd64-4n4c-cgroup-distance-merge.tar.bz2"))
    assert code == 0
    assert "  2MiB (default)        2048     2048        0        0          0" in out
    assert "nodes: possible 0-3, online 0-3" in out
    # no MemAvailable in this dump: the table shows the estimate replay uses, as its note says
    (line,) = [x for x in out.splitlines() if x.startswith("memory: ")]
    shown = line.split("available - (estimated ")[1].split("GiB: see the note)")[0]
    (note,) = [x for x in out.splitlines() if "estimated as the kernel does" in x]
    kb = int(note.split("(si_mem_available) at ")[1].split(" kB")[0])
    assert f"{kb * 1024 / (1 << 30):.2f}" == shown


@pytest.mark.parametrize(
    "content, expect",
    [
        (None, "no such file or directory"),
        (b"\x00\x01binary junk", "nothing umbp-sim reads: 1 line(s)"),
        (b"BZh91AY&SY truncated", "corrupt or unreadable tarball"),
    ],
)
def test_bad_input_is_one_line_exit_65(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None, expect: str
) -> None:
    p = tmp_path / "dump.tar.bz2" if content and content.startswith(b"BZh") else tmp_path / "x"
    if content is not None:
        p.write_bytes(content)
    code, out, err = run(capsys, "inspect", str(p))
    assert code == (66 if content is None else 65) and out == ""  # 66: no such file
    assert err.count("\n") == 1 and err.startswith(f"umbp-sim inspect: {p}")
    assert expect in err and "Traceback" not in err


def test_usage_error_exit_64(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "inspect")
    assert code == 64 and "required: dump" in err


def test_a_dump_on_stdin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    meminfo = Path(__file__).parent / "data" / "replay" / "report1-7.05GB" / "proc" / "meminfo"
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(meminfo.read_bytes())))
    code, out, _ = run(capsys, "inspect", "-", "--json")
    from_stdin = json.loads(out)
    code2, out2, _ = run(capsys, "inspect", str(meminfo), "--json")
    assert code == code2 == 0
    assert from_stdin.pop("name") == "<stdin>"
    ref = json.loads(out2)
    ref.pop("name")
    from_stdin.pop("source", None)
    ref.pop("source", None)
    assert from_stdin == ref


def test_node_lists_read_as_the_kernel_writes_them() -> None:
    from umbp_sim.commands.inspect import _nodes

    assert [_nodes(v) for v in (None, [], [0], [0, 1, 2, 3], [0, 2, 3, 4, 7])] == [
        "-", "-", "0", "0-3", "0,2-4,7"]  # fmt: skip
