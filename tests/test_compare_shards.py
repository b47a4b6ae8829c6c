"""compare --shard K/N on N machines, then --merge: the comparison one run prints, byte for byte
(umbp_sim/comparison/shards.py)."""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


FEW = ["compare", "umbp-sim", "mori-624002c", "--no-scenarios", "-k", "*size=4096,*"]
BIG = "x" * (50 << 20)


def _hostile_shards() -> list[tuple[str, Any, str]]:
    """(what, change of shard 1's JSON, the refusal's text after '--merge FILE: ')."""

    def outcome(**item: Any) -> Callable[[dict[str, Any]], None]:
        def change(doc: dict[str, Any]) -> None:
            doc["differences"]["outcome"] = [item]

        return change

    def field(*path: str, value: Any) -> Callable[[dict[str, Any]], None]:
        def change(doc: dict[str, Any]) -> None:
            where = doc
            for key in path[:-1]:
                where = where[key]
            where[path[-1]] = value

        return change

    def many(doc: dict[str, Any]) -> None:  # 102 differences and differing_runs 0
        doc["differences"] = {
            "outcome": [{"run": f"r{i}", "index": 2 * i, "a": "ok", "b": "x"} for i in range(102)]
        }
        doc["differing_runs"], doc["same"] = 0, True

    def relabelled(doc: dict[str, Any]) -> None:  # a run that differs in two classes
        item = doc["differences"]["warning text"][0]
        doc["differences"]["outcome"] = [{**item, "run": "r"}]

    first = "[no-pool k6.8.0] alloc(size=4096, AnonymousHugetlb, hugepage_size=2097152, " \
        "numa_node=-1, prefault=True)"  # fmt: skip
    return [
        ("n 10**8", field("shard", "n", value=10**8),
         "shard.n is 100000000: expected a number of shards from 1 to 999,999"),
        ("n 10**30", field("shard", "n", value=10**30),
         "shard.n is a 31-digit integer: expected a number of shards from 1 to 999,999"),
        ("total 10**30", field("shard", "total", value=10**30),
         "shard.total is a 31-digit integer: expected a number of runs from 0 to 10,000,000"),
        ("k above n", field("shard", "k", value=3),
         "shard.k is 3: expected the shard's number from 1 to 2"),
        ("digest", field("shard", "digest", value=None),
         "shard.digest is None: expected 16 hexadecimal digits"),
        ("negative runs", field("runs", value=-5),
         "runs is -5: expected 18 (shard 1 of 2 of 36 runs)"),
        ("runs as text", field("runs", value="18"),
         "runs is '18': expected 18 (shard 1 of 2 of 36 runs)"),
        ("102 differences, differing_runs 0", many,
         "differences.outcome: 102 runs, more than its differing_runs (0)"),
        ("differing_runs above its differences", field("differing_runs", value=9),
         "differing_runs is 9: expected 8, the runs its differences list"),
        ("same", field("same", value=True), "same is True: expected False (differing_runs 8)"),
        ("no run", outcome(index=0, a="ok", b="invalid"),
         "differences.outcome[0].run is None: expected a string of 1 to 1,048,576 characters"),
        ("another shard's run", outcome(run="r", index=1, a="ok", b="x"),
         "differences.outcome[0].index is 1: expected a place of shard 1 of 2 (k-1, k-1+n, ...)"),
        ("no b", outcome(run="r", index=0, a="ok"), "differences.outcome[0].b: missing"),
        ("another label", relabelled,
         f"differences.outcome[0].run is 'r': expected {first[:40]!r}... (103 characters), "
         "the label of run 6 in another class"),
        ("a 50 MB value", outcome(run=first, index=0, a=BIG, b="x"),
         f"differences.outcome[0].a is {BIG[:40]!r}... (52428800 characters): expected a "
         "string of at most 1,048,576 characters"),
        ("a float", outcome(run=first, index=0, a=1.5, b="x"),
         "differences.outcome[0].a is 1.5: expected a string, an integer, a list or an object"),
        ("an integer past 64 bits", outcome(run=first, index=0, a=1 << 64, b=0),
         "differences.outcome[0].a is 18446744073709551616: expected an integer of at most 64 "
         "bits"),
        ("a class", field("differences", "nothing", value=[]),
         "'nothing' is not a class of difference"),
        ("a key", field("extra", value=1), "'extra': not a field of a shard"),
    ]  # fmt: skip


@pytest.mark.parametrize("what, change, message", _hostile_shards(), ids=lambda v: str(v)[:30])
def test_merge_refuses_a_bad_shard_naming_its_field(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    what: str,
    change: Callable[[dict[str, Any]], None],
    message: str,
) -> None:
    paths = []
    for k in (1, 2):
        code, out, _ = run(capsys, *FEW, "--shard", f"{k}/2", "--json")
        paths.append(tmp_path / f"{k}.json")
        paths[-1].write_text(out)
    doc = json.loads(paths[0].read_text())
    change(doc)
    paths[0].write_text(json.dumps(doc))
    started = time.monotonic()
    code, out, err = run(capsys, "compare", "--merge", *map(str, paths))
    assert (code, out, err) == (65, "", f"umbp-sim compare: --merge {paths[0]}: {message}\n")
    assert time.monotonic() - started < 5, what


def test_merge_refuses_what_is_no_json_of_a_shard(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.json"
    cases = [
        ('{"shard": {}, "a": Infinity}', "not JSON (Infinity is not a JSON number)"),
        ("[" * 100_000, "not JSON (maximum recursion depth exceeded while decoding a JSON array"
         " from a unicode string)"),
        ("[" + "0," * 8_000_000 + "0]", "more than 8,000,000 JSON values: not a shard"),
    ]  # fmt: skip
    for text, message in cases:
        bad.write_text(text)
        code, out, err = run(capsys, "compare", "--merge", str(bad))
        assert (code, out, err) == (65, "", f"umbp-sim compare: --merge {bad}: {message}\n")


def test_merged_report_bounds_and_escapes_what_it_echoes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    paths = []
    for k in (1, 2):
        _, out, _ = run(capsys, *FEW, "--shard", f"{k}/2", "--json")
        paths.append(tmp_path / f"{k}.json")
        paths[-1].write_text(out)
    doc = json.loads(paths[0].read_text())
    item = doc["differences"]["warning text"][0]
    item["a"], item["b"] = ["\x1b]0;owned\x07 warned"], "y" * 100_000
    paths[0].write_text(json.dumps(doc))
    code, out, err = run(capsys, "compare", "--merge", *map(str, paths))
    assert (code, err) == (1, "")
    lines = out.splitlines()
    at = lines.index(f"  {item['run']}")
    assert lines[at + 1 : at + 3] == [
        "    A: ['\\x1b]0;owned\\x07 warned']",
        f"    B: {'y' * 40!r}... (100000 characters)",
    ]


def test_control_characters_of_a_warning_are_escaped_in_junit(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """XML 1.0 forbids most C0 controls even as references: each is written \\xHH, visibly."""
    paths = []
    for k in (1, 2):
        _, out, _ = run(capsys, *FEW, "--shard", f"{k}/2", "--json")
        paths.append(tmp_path / f"{k}.json")
        paths[-1].write_text(out)
    doc = json.loads(paths[0].read_text())
    doc["a"] = "umbp-sim\x1b]0;t\x07"
    item = doc["differences"]["warning text"][0]
    said = "error: \x1b[31mred\x00\x0c tab\there\nnext \udcff"
    doc["differences"]["outcome"] = [{"run": item["run"], "index": item["index"], "a": said,
                                      "b": "ok Anonymous"}]  # fmt: skip
    paths[0].write_text(json.dumps(doc))
    doc = json.loads(paths[1].read_text())
    doc["a"] = "umbp-sim\x1b]0;t\x07"
    paths[1].write_text(json.dumps(doc))
    junit = tmp_path / "j.xml"
    code, out, err = run(capsys, "compare", "--merge", *map(str, paths), "--junit", str(junit))
    assert (code, err) == (1, "")
    root = ET.parse(junit).getroot()
    assert root[0].get("name") == "umbp-sim compare umbp-sim\\x1b]0;t\\x07 mori-624002c"
    failure = next(root.iter("failure"))  # the outcome's
    assert "  A: error: \\x1b[31mred\\x00\\x0c tab\there\nnext \\udcff\n" in failure.text
    # the text report: the same escapes, a value in one line
    assert out.startswith("compared umbp-sim\\x1b]0;t\\x07 (A) with mori-624002c (B) over 36")
    assert "    A: error: \\x1b[31mred\\x00\\x0c tab\\x09here\\x0anext \\udcff\n" in out
