"""Pictures (issue 18, item 7): a bar per node of memory and hugepage pools against the request,
on the terminal (`umbp-sim replay`) and as an HTML page (`--html FILE`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from umbp_sim.cli import main
from umbp_sim.diagnose.html_report import render_html
from umbp_sim.diagnose.picture import describe_node, human, needed_bytes, picture, render_bars
from umbp_sim.machine import HugePool, Machine, Node

D = Path(__file__).parent / "data" / "replay"
GiB = 1 << 30
MiB = 1 << 20


def two_nodes() -> Machine:
    return Machine.x86_64(nodes=2, mem_per_node="8GiB", hugepages_per_node=[{"2MiB": 1024}, {}])


def test_numbers_of_a_bound_hugetlb_request() -> None:
    pic = picture(two_nodes(), [GiB + 1], "AnonymousHugetlb", 2 * MiB, 1, "demoted")
    assert pic.needed == GiB + 2 * MiB  # whole 2 MiB pages
    n0, n1 = pic.nodes
    assert (n0.pool_total, n0.pool_free, n0.mem_free, n0.target) == (2 * GiB, 2 * GiB, 6 * GiB,
                                                                      False)  # fmt: skip
    assert (n1.pool_total, n1.pool_free, n1.target, n1.short) == (0, 0, True, GiB + 2 * MiB)
    assert [s.kind for s in n0.segments] == [
        "pool_free", "pool_used", "other_pools", "mem_used", "mem_free"]  # fmt: skip
    assert sum(s.nbytes for s in n0.segments) == 8 * GiB


def test_used_pages_and_other_pools_are_their_own_segments() -> None:
    pools = {2 * MiB: HugePool(total=512, free=100), GiB: HugePool(total=2)}
    node = Node(0, 16 * GiB, mem_free=4 * GiB, hugepages=pools)
    m = Machine(nodes=[node])
    (n,) = picture(m, [4096], "AnonymousHugetlb", 2 * MiB, -1, "ok").nodes
    sizes = {s.kind: s.nbytes for s in n.segments}
    assert sizes == {"pool_free": 200 * MiB, "pool_used": 824 * MiB, "other_pools": 2 * GiB,
                     "mem_used": 9 * GiB, "mem_free": 4 * GiB}  # fmt: skip
    assert not n.target and n.short == 0


def test_plain_memory_request_is_not_rounded_and_compares_with_free_memory() -> None:
    assert needed_bytes([5, 7], hugetlb=False, hugepage_size=2 * MiB) == 12
    pic = picture(two_nodes(), [7 * GiB], "Anonymous", 2 * MiB, 0, "failed")
    assert pic.nodes[0].short == GiB  # 6 GiB free outside the pool on node 0
    assert pic.nodes[1].short == 0 and not pic.nodes[1].target


def test_a_node_that_gave_the_request_what_it_needed_is_never_short() -> None:
    """7 GiB on a node with 6 GiB free that succeeded (the kernel reclaimed page cache): the bar
    says it fit, not "short 1.0 GiB"."""
    pic = picture(two_nodes(), [7 * GiB], "Anonymous", 2 * MiB, 0, "ok")
    assert pic.nodes[0].short == 0
    assert describe_node(pic, pic.nodes[0]).endswith("; the request fits")
    failed = picture(two_nodes(), [GiB], "Anonymous", 2 * MiB, 0, "failed")
    assert describe_node(failed, failed.nodes[0]).endswith("; what is free here covers the request")


def test_bars_stay_aligned_with_two_digit_node_ids() -> None:
    m = Machine.x86_64(nodes=12, mem_per_node="4GiB", hugepages={"2MiB": 12})
    lines = render_bars(picture(m, [GiB], "Anonymous", 2 * MiB, 10, "ok"), width=20).splitlines()
    bars = [line for line in lines if "[" in line]
    assert len(bars) == 13 and len({line.index("[") for line in bars}) == 1
    assert bars[10].startswith("  node 10* [") and bars[-1].startswith("  request  [")


def test_terminal_bars_one_per_node() -> None:
    pic = picture(two_nodes(), [GiB], "AnonymousHugetlb", 2 * MiB, 1, "demoted")
    lines = render_bars(pic, width=20).splitlines()
    assert lines[0] == "request: 1.0 GiB of 2 MiB hugepages (AnonymousHugetlb) on node 1 -> demoted"
    assert lines[1] == ("  node 0  [#####...............]  2 MiB pool 2.0 GiB free of 2.0 GiB; "
                        "memory 6.0 GiB free of 8.0 GiB")  # fmt: skip
    assert lines[2] == ("  node 1* [.|..................]  2 MiB pool 0 B free of 0 B; "
                        "memory 8.0 GiB free of 8.0 GiB; short 1.0 GiB")  # fmt: skip
    assert lines[3] == "  request [##                  ]  1.0 GiB"
    assert lines[4].startswith("  # free 2 MiB pages  = used 2 MiB pages  % other pools")
    assert lines[4].endswith(". free memory  | where the request's need ends on its node")
    unbound = render_bars(picture(two_nodes(), [GiB], "AnonymousHugetlb", 2 * MiB, -1, "ok"))
    assert "|" not in unbound.splitlines()[-1]  # no bound node, no mark to explain


def test_bars_have_the_same_width_whatever_the_sizes() -> None:
    for sizes in ([0], [1], [GiB], [100 * GiB]):
        pic = picture(two_nodes(), sizes, "AnonymousHugetlb", 2 * MiB, 0, "ok")
        bars = re.findall(r"\[([^\]]*)\]", render_bars(pic, width=30))
        assert [len(b) for b in bars] == [30, 30, 30], sizes


def test_human() -> None:
    assert [human(n) for n in (0, 1023, 1024, 1536 * MiB, 3 << 40)] == [
        "0 B", "1023 B", "1.0 KiB", "1.5 GiB", "3.0 TiB"]  # fmt: skip


def test_html_has_one_bar_per_node_and_escapes_text() -> None:
    m = Machine.x86_64(nodes=3, mem_per_node="4GiB", hugepages={"2MiB": 30}, name="<host&>")
    page = render_html(picture(m, [GiB], "Anonymous", 2 * MiB, 2, "ok"), details="a < b")
    assert page.count('<div class="node-bar">') == 3
    assert page.count('<div class="request-bar">') == 1
    assert page.count('class="mark"') == 1  # on the bound node only
    assert "&lt;host&amp;&gt;" in page and "<host&>" not in page
    assert "<pre>a &lt; b</pre>" in page


def test_replay_prints_the_bars(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["replay", str(D / "pool-on-node0-6.8.0"), "--size", "1GiB", "--numa-node", "1"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    section = out.split("memory per node:\n")[1].splitlines()
    assert section[0] == (
        "request: 1.0 GiB of 2 MiB hugepages (AnonymousHugetlb) on node 1 -> crashed"
    )
    assert [line.split("[")[0].strip() for line in section[1:4]] == ["node 0", "node 1*", "request"]
    assert section[2].endswith("short 1.0 GiB")


def test_replay_writes_html(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "r.html"
    argv = ["replay", str(D / "pool-on-node0-6.8.0"), "--size", "1GiB", "--numa-node", "1"]
    assert main([*argv, "--html", str(page), "--json"]) == 0  # SIGBUS on node 1 (mori)
    capsys.readouterr()
    text = page.read_text(encoding="utf-8")
    assert text.count('<div class="node-bar">') == 2
    # a page, not the text report in a block: headed sections, the outcome coloured, each fix
    # with its commands as code
    assert "<pre>" not in text
    heads = re.findall(r"<h2>([^<]*)</h2>", text)
    assert heads[:4] == ["1. what the user saw", "memory per node", "2. why", "3. what to change"]
    assert re.search(r"<p class='outcome' style='border-color:#c62828'><b [^>]*>crashed: ", text)
    assert "<ol class='fixes'><li>" in text
    assert "<pre class='cmd'><code>--numa-node 0</code></pre>" in text


def test_the_page_and_the_text_report_say_the_same(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both are rendered from the same sections: every cause and fix command of the text is on
    the page, escaped."""
    import html

    argv = ["replay", str(D / "pool-on-node0-6.8.0"), "--size", "1GiB", "--numa-node", "1"]
    page = tmp_path / "r.html"
    main([*argv, "--html", str(page)])
    out = capsys.readouterr().out
    text = page.read_text(encoding="utf-8")
    why = out.split("\n2. why\n")[1].split("\n\n")[0].splitlines()
    assert why and all(html.escape(line.strip()[2:]) in text for line in why)
    commands = re.findall(r"^        (\S.*)$", out, re.M)
    assert commands and all(html.escape(c) in text for c in commands)


def test_replay_html_unwritable_is_one_line_exit_73(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "missing" / "r.html"
    argv = ["replay", str(D / "pool-on-node0-6.8.0"), "--size", "1GiB", "--html", str(bad)]
    assert main(argv) == 73
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"umbp-sim replay: --html {bad}: cannot write: No such file or directory\n"
    )


def test_nothing_is_drawn_for_a_request_without_sizes() -> None:
    from types import SimpleNamespace

    from umbp_sim.diagnose.picture import bars_for, picture_of

    def refuse() -> list[int]:
        raise ValueError("SGLANG_HICACHE_HOST_NUMA_NODE: not an integer")

    request = SimpleNamespace(buffer_sizes=refuse, settings=lambda: ("Anonymous", 0, -1, True))
    d = SimpleNamespace(machine=two_nodes(), request=request, run=SimpleNamespace(outcome="failed"))
    assert picture_of(d) is None  # type: ignore[arg-type]
    assert bars_for(d) == ""  # type: ignore[arg-type]
