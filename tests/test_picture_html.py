"""The HTML report of `umbp-sim replay --html`, opened in headless Chromium and screenshotted:
the page shows one bar per node (issue 18, item 7).

Chromium comes from Debian (`apt-get install chromium`; `.ci/run` installs it). The bars are
counted in the screenshot's pixels: every node's bar has a frame of its own colour
(``NODE_FRAME``), and all bars start at the same x, so the frame's left edge is one vertical
run per bar.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from umbp_sim.cli import main
from umbp_sim.diagnose.html_report import NODE_FRAME, REQUEST_COLOR

ROOT = Path(__file__).resolve().parent.parent
FOUR_NODES = ROOT / "scenarios" / "dumps" / "16amd64-4n4c-cgroup-distance-merge.tar.bz2"
TWO_NODES = Path(__file__).parent / "data" / "replay" / "pool-on-node0-6.8.0"


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("headless Chromium is needed: apt-get install chromium (.ci/run installs it)")


def screenshot(page: Path, png: Path, tmp_path: Path) -> Image.Image:
    # A clean environment: no LD_PRELOAD/ASAN_OPTIONS of a sanitizer run, a throw-away profile.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
           "LANG": "C.UTF-8"}  # fmt: skip
    cmd = [
        chromium(),
        "--headless",
        "--no-sandbox",  # CI runs as root
        "--disable-gpu",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--window-size=1200,1000",
        f"--screenshot={png}",
        page.as_uri(),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert png.exists(), f"chromium wrote no screenshot (exit {proc.returncode}):\n{proc.stderr}"
    return Image.open(png).convert("RGB")


def _rgb(color: str) -> tuple[int, int, int]:
    return int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16)


def bar_runs(img: Image.Image, color: str) -> list[tuple[int, int]]:
    """(top, height) of each vertical run of ``color`` in the column where it is most frequent:
    the left edge of the frames of that colour."""
    rgb = _rgb(color)
    width, height = img.size
    px = img.load()
    counts = [sum(1 for y in range(height) if px[x, y] == rgb) for x in range(width)]
    column = max(range(width), key=counts.__getitem__)
    if counts[column] == 0:
        return []
    runs: list[tuple[int, int]] = []
    start = None
    for y in range(height + 1):
        hit = y < height and px[column, y] == rgb
        if hit and start is None:
            start = y
        elif not hit and start is not None:
            runs.append((start, y - start))
            start = None
    return runs


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
