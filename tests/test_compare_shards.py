"""compare --shard K/N on N machines, then --merge: the comparison one run prints, byte for byte
(umbp_sim/external/shards.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from umbp_sim.cli import main

ARGS = ["compare", "umbp-sim", "mori-624002c", "-k", "*Hugetlb*"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def shards(capsys: pytest.CaptureFixture[str], tmp_path: Path, n: int) -> list[str]:
    paths = []
    for k in range(1, n + 1):
        code, out, _ = run(capsys, *ARGS, "--shard", f"{k}/{n}", "--json", "--jobs", "1")
        assert code in (0, 1)
        path = tmp_path / f"shard-{k}.json"
        path.write_text(out)
        paths.append(str(path))
    return paths


def test_merged_shards_are_the_one_run(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, whole, _ = run(capsys, *ARGS, "--json", "--jobs", "1")
    doc = json.loads(whole)
    assert code == 1 and doc["differing_runs"] > 10 and "shard" not in doc
    paths = shards(capsys, tmp_path, 3)
    parts = [json.loads(Path(p).read_text()) for p in paths]
    assert sum(p["runs"] for p in parts) == doc["runs"]
    assert {p["shard"]["k"] for p in parts} == {1, 2, 3}
    assert all(p["runs"] < doc["runs"] for p in parts)  # each ran its share only
    # Given in any order: the JSON and the report one run prints, and its exit status.
    assert run(capsys, "compare", "--merge", *reversed(paths), "--json") == (1, whole, "")
    _, report, _ = run(capsys, *ARGS, "--jobs", "1")
    assert run(capsys, "compare", "--merge", *paths) == (1, report, "")


def test_a_share_without_runs_merges_too(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    few = ["compare", "umbp-sim", "mori-624002c", "--no-scenarios", "-k", "*size=4096,*"]
    code, whole, _ = run(capsys, *few, "--json")
    total = json.loads(whole)["runs"]
    paths = []
    for k in range(1, total + 2):  # one more share than runs: the last has none
        _, out, _ = run(capsys, *few, "--shard", f"{k}/{total + 1}", "--json")
        (tmp_path / f"{k}.json").write_text(out)
        paths.append(str(tmp_path / f"{k}.json"))
    assert json.loads(Path(paths[-1]).read_text())["runs"] == 0
    assert run(capsys, "compare", "--merge", *paths, "--json") == (code, whole, "")


def test_merge_refuses_what_is_not_the_whole(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    paths = shards(capsys, tmp_path, 2)
    other = tmp_path / "other.json"
    _, out, _ = run(capsys, "compare", "umbp-sim", "umbp-sim", "-k", "*Hugetlb*", "--shard", "2/2",
                    "--json")  # fmt: skip
    other.write_text(out)
    plain = tmp_path / "plain.json"
    plain.write_text(run(capsys, *ARGS, "--json")[1])
    cases = [
        ([paths[0]], "--merge: shard(s) 2 of 2 missing"),
        ([paths[0], paths[0], paths[1]], "shard 1/2 again"),
        ([paths[0], str(other)], f"--merge {other}: a shard of another comparison"),
        ([str(plain)], f"--merge {plain}: not the JSON of a shard"),
        ([str(tmp_path / "nope.json")], f"--merge {tmp_path / 'nope.json'}: No such file"),
        ([str(tmp_path)], f"--merge {tmp_path}: a directory"),
    ]
    for files, message in cases:
        code, out, err = run(capsys, "compare", "--merge", *files)
        assert (code, out) == (64, ""), files
        assert message in err, err
    assert run(capsys, "compare", "umbp-sim", "--merge", paths[0])[0] == 64
    code, _, err = run(capsys, *ARGS, "--shard", "3/2")
    assert code == 64 and "--shard '3/2': expected K/N with 1 <= K <= N" in err
