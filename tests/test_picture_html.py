"""The HTML report of `umbp-sim replay --html`, opened in headless Chromium and screenshotted:
the page shows one bar per node (issue 18, item 7).

Chromium comes from Debian (`apt-get install chromium`; `.ci/run` installs it). The bars are
counted in the screenshot's pixels: every node's bar has a frame of its own colour
(``NODE_FRAME``), and all bars start at the same x, so the frame's left edge is one vertical
run per bar.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from html_shots import bar_runs, screenshot

from umbp_sim.cli import main
from umbp_sim.diagnose.html_report import NODE_FRAME, REQUEST_COLOR

ROOT = Path(__file__).resolve().parent.parent
FOUR_NODES = ROOT / "scenarios" / "dumps" / "16amd64-4n4c-cgroup-distance-merge.tar.bz2"
TWO_NODES = Path(__file__).parent / "data" / "replay" / "pool-on-node0-6.8.0"


@pytest.mark.browser
@pytest.mark.parametrize(
    ("dump", "request_args", "nodes"),
    [
        (FOUR_NODES, ["--size", "1GiB", "--numa-node", "2"], 4),
        (TWO_NODES, ["--size", "1GiB", "--numa-node", "1"], 2),
    ],
    ids=["4-nodes", "2-nodes"],
)
def test_html_report_shows_one_bar_per_node(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    dump: Path,
    request_args: list[str],
    nodes: int,
) -> None:
    page = tmp_path / "report.html"
    assert main(["replay", str(dump), *request_args, "--html", str(page)]) == 0
    capsys.readouterr()
    img = screenshot(page, tmp_path / "report.png", tmp_path)

    node_bars = bar_runs(img, NODE_FRAME)
    assert len(node_bars) == nodes, node_bars
    assert all(h == 26 for _, h in node_bars), node_bars  # the bars' CSS height, frame included
    tops = [t for t, _ in node_bars]
    assert tops == sorted(tops) and len(set(tops)) == nodes  # stacked, one under the other

    (request_bar,) = bar_runs(img, REQUEST_COLOR)  # the request's bar, below the nodes
    assert request_bar[0] > tops[-1]
