"""The HTML pages of a fleet replay and of ``compare`` (issue 18, item 7), opened in headless
Chromium: a row per host and each host's bars (one per node, counted in the screenshot's
pixels), one group per class of difference with its runs; hostile texts stay text.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from html_shots import Elements, bar_runs, rendered_dom, screenshot

from umbp_sim.cli import main
from umbp_sim.comparison.differences import Comparison
from umbp_sim.comparison.report_html import render_compare_html
from umbp_sim.diagnose.fleet import FleetReport, HostRow
from umbp_sim.diagnose.html_report import NODE_FRAME, render_fleet_html
from umbp_sim.diagnose.picture import picture
from umbp_sim.diagnose.replay_request import Request
from umbp_sim.dump import load_dump
from umbp_sim.machine import Machine
from umbp_sim.request import AllocRequest

ROOT = Path(__file__).resolve().parent.parent
REPLAY = ROOT / "tests" / "data" / "replay"
FOUR_NODES = ROOT / "scenarios" / "dumps" / "16amd64-4n4c-cgroup-distance-merge.tar.bz2"
REQUEST = ["--size", "8GiB", "--backing", "hugetlb", "--numa-node", "0"]
HOSTILE = '<script>alert(1)</script><img src=x onerror="alert(2)">&amp;"\''


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    """A 4-node tarball, two 2-node dump directories and a meminfo that cannot be read."""
    d = tmp_path / "fleet"
    d.mkdir()
    shutil.copy(FOUR_NODES, d)
    shutil.copytree(REPLAY / "no-pool-512g", d / "no-pool-512g")
    shutil.copytree(REPLAY / "pool-on-node0-6.8.0", d / "pool-on-node0-6.8.0")
    (d / "bad-meminfo").write_text("garbage\n")
    return d


@pytest.mark.browser
def test_fleet_page_a_row_per_host_and_a_bar_per_node(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "fleet.html"
    code = main(["replay", str(fleet), *REQUEST, "--json", "--html", str(page)])
    doc = json.loads(capsys.readouterr().out)
    assert code == doc["exit_code"] == 65  # the unreadable dump
    hosts = doc["hosts"]
    nodes = {
        h["dump"]: len(load_dump(h["dump"])[0].nodes) for h in hosts if h["outcome"] != "unreadable"
    }
    assert sorted(nodes.values()) == [2, 2, 4]

    dom = Elements(rendered_dom(page, tmp_path))  # as Chromium parsed it
    rows = dom.having("tr", "host")
    assert len(rows) == len(hosts) == 4
    for row, host in zip(rows, hosts, strict=True):
        assert row["attrs"]["data-outcome"] == host["outcome"]
        assert row["text"].startswith(host["host"])
    summary = {}
    for row in dom.having("tr", "outcome"):  # "demoted" "2" -> "demoted2"
        outcome, count = re.fullmatch(r"(\D+)(\d+)", row["text"]).groups()  # type: ignore[union-attr]
        summary[outcome] = int(count)
    assert summary == doc["summary"]
    sections = dom.having("section", "host-bars")
    assert len(sections) == 4
    # each host's section: its name, then a bar per node of that host
    assert [s["text"].split()[0] for s in sections] == [h["host"] for h in hosts]
    bars = dom.having("div", "node-bar")
    assert len(bars) == sum(nodes.values()) == 8
    assert len(dom.having("div", "request-bar")) == 3  # not for the unreadable dump

    img = screenshot(page, tmp_path / "fleet.png", tmp_path, height=3000)
    drawn = bar_runs(img, NODE_FRAME)
    assert len(drawn) == 8, drawn
    assert all(h == 26 for _, h in drawn), drawn


@pytest.mark.browser
def test_compare_page_a_group_per_class_of_difference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "compare.html"
    argv = ["compare", "umbp-sim", "mori", "--no-scenarios", "-k", "*pool-on-node0 k6.8.0*"]
    assert main([*argv, "--json", "--html", str(page)]) == 1
    doc = json.loads(capsys.readouterr().out)
    diffs = doc["differences"]
    assert {"outcome", "backing", "warning text"} <= set(diffs)

    dom = Elements(rendered_dom(page, tmp_path))
    groups = dom.having("section", "diff-class")
    assert [g["attrs"]["data-class"] for g in groups] == list(diffs)  # in the report's order
    runs = dom.having("tr", "run")
    assert len(runs) == sum(len(items) for items in diffs.values())
    start = 0
    for group, (cls, items) in zip(groups, diffs.items(), strict=True):
        assert group["text"].startswith(f"{cls} {len(items)} runs")
        for row, item in zip(runs[start : start + len(items)], items, strict=True):
            assert row["text"].startswith(item["run"])
        start += len(items)
    # each allocator's outcome of a run: the SIGBUS mori dies of where umbp-sim demotes
    sigbus = [r["text"] for r in runs if "crash SIGBUS in alloc" in r["text"]]
    assert sigbus and all("ok Anonymous" in t for t in sigbus)
    counts = dom.having("table", "classes")[0]["text"]
    assert all(f"{cls}{len(items)}" in counts for cls, items in diffs.items())


@pytest.mark.browser
def test_hostile_texts_stay_text_and_nothing_is_fetched(tmp_path: Path) -> None:
    m = Machine.x86_64(nodes=2, mem_per_node="8GiB", hugepages={"2MiB": 16})
    pic = picture(m, [1 << 30], "AnonymousHugetlb", 2 << 20, 0, "demoted")
    request = Request(AllocRequest(1 << 30, "AnonymousHugetlb", numa_node=0))
    row = HostRow(f"/d/{HOSTILE}", HOSTILE, "demoted", "Anonymous", HOSTILE, HOSTILE, 1,
                  picture=pic)  # fmt: skip
    report = FleetReport(request, [row])
    hostile_run = {"run": HOSTILE, "a": [HOSTILE], "b": []}
    result = Comparison(HOSTILE, "b", 1, 1, by_class={"warning text": [hostile_run]})
    for name, text in (
        ("fleet", render_fleet_html(report)),
        ("compare", render_compare_html(result, {HOSTILE: HOSTILE}, {})),
    ):
        # no element from the texts; nothing the page would fetch (self-contained)
        for needle in ("<script", "<img", "<iframe", "<link", "http:", "https:", "url(", "@import"):
            assert needle not in text.lower(), (name, needle)
        page = tmp_path / f"{name}.html"
        page.write_text(text, encoding="utf-8")
        dom = Elements(rendered_dom(page, tmp_path))
        assert not [e for e in dom.elements if e["tag"] in ("script", "img", "iframe", "link")]
        (body,) = [e for e in dom.elements if e["tag"] == "body"]
        assert HOSTILE in body["text"]  # shown as the text it is


def test_control_characters_are_visible_escapes_in_every_page() -> None:
    """An allocator's warning or a dump's host name with control characters: each one is
    written \\xHH (\\uXXXX for a lone surrogate), none reaches the page raw."""
    said = "warn\x1b[2J\x00\x07\x9b \udcff end"
    m = Machine.x86_64(nodes=2, mem_per_node="8GiB", hugepages={"2MiB": 16})
    pic = picture(m, [1 << 30], "AnonymousHugetlb", 2 << 20, 0, "demoted")
    request = Request(AllocRequest(1 << 30, "AnonymousHugetlb", numa_node=0))
    row = HostRow(f"/d/{said}", said, "demoted", "Anonymous", said, said, 1, picture=pic)
    result = Comparison("a", "b", 1, 1, by_class={"outcome": [{"run": "r", "a": said, "b": "x"}]})
    for name, text in (
        ("fleet", render_fleet_html(FleetReport(request, [row]))),
        ("compare", render_compare_html(result, {"r": said}, {})),
    ):
        assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]", text), name
        assert "warn\\x1b[2J\\x00\\x07\\x9b \\udcff end" in text, name


def test_an_unwritable_page_fails_before_the_work(
    fleet: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "no" / "dir" / "page.html"
    for argv in (
        ["replay", str(fleet), *REQUEST],
        ["compare", "umbp-sim", "mori", "--matrix", "none"],
    ):
        assert main([*argv, "--html", str(bad)]) == 73
        out = capsys.readouterr()
        assert out.out == ""
        assert out.err == (
            f"umbp-sim {argv[0]}: --html {bad}: cannot write: No such file or directory\n"
        )
    assert not (tmp_path / "no").exists()
