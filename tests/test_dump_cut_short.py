"""A dump cut short (issue 19): collect's manifest comes first and lists every file with its
size; a copy that lost files, or whose gzip/xz/tar stream ends early, is one line (exit 65)
naming the archive and what is missing, never a replay of a different machine."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from test_collect_script import KINDS, run_script

from umbp_sim.dump import DumpError, load_dump
from umbp_sim.live_dump import collect

MANIFEST = "here/umbp-sim-collect.json"


@pytest.fixture(scope="module")
def dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cut") / "host.tar"
    collect(str(out), "here")
    return out


def members(path: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(path) as tar:
        return tar.getmembers()


def read_manifest(path: Path) -> dict:
    with tarfile.open(path) as tar:
        return json.load(tar.extractfile(MANIFEST))  # type: ignore[arg-type]


def repack(src: Path, dst: Path, mode: str, drop: set[str] = frozenset(), grow: str = "") -> None:  # type: ignore[assignment]
    with tarfile.open(src) as tin, tarfile.open(dst, mode) as tout:
        for m in tin.getmembers():
            if m.name in drop:
                continue
            data = tin.extractfile(m).read() if m.isfile() else b""  # type: ignore[union-attr]
            if m.name == grow:
                data += b"\n"
                m.size = len(data)
            tout.addfile(m, io.BytesIO(data) if m.isfile() else None)


def error_of(path: Path) -> DumpError:
    with pytest.raises(DumpError) as e:
        load_dump(path)
    return e.value


def test_manifest_is_first_and_lists_every_file_with_its_size(dump: Path) -> None:
    ms = members(dump)
    assert [m.name for m in ms if m.isfile()][0] == MANIFEST  # the first file
    files = {m.name: m.size for m in ms if m.isfile() and m.name != MANIFEST}
    man = read_manifest(dump)
    assert {f"here/{k}": v for k, v in man["files"].items()} == files
    assert sorted(man["files"]) == man["collected"]
    load_dump(dump)  # whole: loads


@pytest.mark.parametrize("kind", KINDS)
def test_stand_alone_collectors_write_the_same_manifest_first(tmp_path: Path, kind: str) -> None:
    out = tmp_path / "s.tar.gz"
    proc = run_script(tmp_path, kind, "-o", str(out), "--name", "here")
    assert proc.returncode == 0, proc.stderr
    ms = members(out)
    assert [m.name for m in ms if m.isfile()][0] == MANIFEST  # the first file
    files = {m.name: m.size for m in ms if m.isfile() and m.name != MANIFEST}
    assert {f"here/{k}": v for k, v in read_manifest(out)["files"].items()} == files
    load_dump(out)


def test_a_file_the_manifest_lists_is_missing(dump: Path, tmp_path: Path) -> None:
    node_files = sorted(m.name for m in members(dump) if m.name.endswith("/meminfo"))
    total = len(read_manifest(dump)["files"])
    p = tmp_path / "lost.tar.gz"
    repack(dump, p, "w:gz", drop={node_files[-1]})
    e = error_of(p)
    assert str(e) == (
        f"{p}: cut short: 1 of the {total} files its manifest ({MANIFEST}) lists are not in it: "
        f"{node_files[-1]}"
    )
    assert e.exit_code == 65


def test_a_file_of_another_size(dump: Path, tmp_path: Path) -> None:
    p = tmp_path / "grown.tar"
    repack(dump, p, "w", grow="here/proc/meminfo")
    size = read_manifest(dump)["files"]["proc/meminfo"]
    assert str(error_of(p)) == (
        f"{p}: here/proc/meminfo is {size + 1} bytes, its manifest ({MANIFEST}) says {size}: "
        "the archive is not the one collect wrote"
    )


@pytest.mark.parametrize("mode,zname", [("w:gz", "gzip"), ("w:xz", "xz")])
def test_a_truncated_stream_names_what_the_manifest_lost(
    dump: Path, tmp_path: Path, mode: str, zname: str
) -> None:
    whole = tmp_path / f"whole.{mode[2:]}"
    repack(dump, whole, mode)
    data = whole.read_bytes()
    p = tmp_path / f"cut.tar.{mode[2:]}"
    p.write_bytes(data[: len(data) * 3 // 4])
    e = error_of(p)
    total = len(read_manifest(dump)["files"])
    m = re.fullmatch(
        rf"{re.escape(str(p))}: cut short: the {zname} data ends before its stream does "
        rf"\(after \d+ bytes unpacked\); (\d+) of the {total} files its manifest "
        rf"\({MANIFEST}\) lists are not in it: here/\S+(, here/\S+)*( \(and \d+ more\))?",
        str(e),
    )
    assert m, str(e)
    assert 1 <= int(m.group(1)) <= total and e.exit_code == 65


def test_a_truncated_bzip2_block_loses_everything(dump: Path, tmp_path: Path) -> None:
    whole = tmp_path / "whole.tar.bz2"
    repack(dump, whole, "w:bz2")  # one 900 kB block: nothing of it decodes without its end
    p = tmp_path / "cut.tar.bz2"
    p.write_bytes(whole.read_bytes()[:-100])
    assert str(error_of(p)) == (
        f"{p}: cut short: the bzip2 data ends before its stream does (after 0 bytes unpacked); "
        "the files after that point are missing"
    )


def test_a_plain_tar_cut_at_a_member_boundary(dump: Path, tmp_path: Path) -> None:
    data = dump.read_bytes()
    ms = members(dump)
    cut = ms[len(ms) // 2].offset  # where a header starts: the tar reads to there cleanly
    p = tmp_path / "cut.tar"
    p.write_bytes(data[:cut])
    msg = str(error_of(p))
    assert msg.startswith(
        f"{p}: cut short: the tar data ends without its end-of-archive blocks (offset {cut}); "
    )
    assert " files its manifest (here/umbp-sim-collect.json) lists are not in it: " in msg


def test_a_cut_archive_without_a_manifest(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        raw = b"MemTotal: 1024 kB\n"
        info = tarfile.TarInfo("H/proc/meminfo")
        info.size = len(raw)
        tar.addfile(info, io.BytesIO(raw))
    p = tmp_path / "h.tar"
    p.write_bytes(buf.getvalue()[:1024])  # header + data, no end-of-archive blocks
    assert str(error_of(p)) == (
        f"{p}: cut short: the tar data ends without its end-of-archive blocks (offset 1024); "
        "the files after that point are missing"
    )


def test_cli_says_it_in_one_line(dump: Path, tmp_path: Path) -> None:
    p = tmp_path / "cut.tar"
    p.write_bytes(dump.read_bytes()[:2048])
    proc = subprocess.run(
        [sys.executable, "-P", "-m", "umbp_sim.cli", "replay", str(p), "--size", "1GiB"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 65 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(f"umbp-sim replay: {p}: cut short: ")


def test_an_unpacked_dump_checked_against_its_manifest(dump: Path, tmp_path: Path) -> None:
    with tarfile.open(dump) as tar:
        tar.extractall(tmp_path, filter="data")
    root = tmp_path / "here"
    load_dump(tmp_path)  # whole: loads, from the directory holding it or from itself
    load_dump(root)
    total = len(read_manifest(dump)["files"])
    (root / "proc" / "meminfo").write_bytes((root / "proc" / "meminfo").read_bytes() + b"\n")
    size = read_manifest(dump)["files"]["proc/meminfo"]
    assert str(error_of(root)) == (
        f"{root}/proc/meminfo: {size + 1} bytes, its manifest ({root}/umbp-sim-collect.json) "
        f"says {size}: the dump is not the one collect wrote"
    )
    (root / "proc" / "meminfo").write_bytes((root / "proc" / "meminfo").read_bytes()[:-1])
    (root / "proc" / "sys" / "vm" / "overcommit_ratio").unlink()
    (root / "proc" / "self" / "limits").unlink()
    for path in (tmp_path, root):
        e = error_of(path)
        assert str(e) == (
            f"{path}: cut short: 2 of the {total} files its manifest "
            f"({root}/umbp-sim-collect.json) lists are not in it: proc/self/limits, "
            "proc/sys/vm/overcommit_ratio"
        )


@pytest.mark.parametrize(("mode", "zname"), [("w:gz", "gzip"), ("w:xz", "xz"), ("w:bz2", "bzip2")])
@pytest.mark.parametrize("cut", [1, 4, 8, 30])
def test_a_stream_cut_in_its_last_bytes_is_cut_short(
    dump: Path, tmp_path: Path, mode: str, zname: str, cut: int
) -> None:
    """Every member and the end-of-archive blocks may be in what is left (the tail is the
    record's zero padding and the compressor's trailer): still a cut copy, not the machine."""
    whole = tmp_path / f"whole.{mode[2:]}"
    repack(dump, whole, mode)
    data = whole.read_bytes()
    p = tmp_path / f"cut.tar.{mode[2:]}"
    p.write_bytes(data[:-cut])
    e = error_of(p)
    assert str(e).startswith(f"{p}: cut short: the {zname} data ends before its stream does")
    assert e.exit_code == 65
    load_dump(whole)  # the whole copy reads
