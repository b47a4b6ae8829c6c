"""Headless Chromium (Debian's `chromium`, which `tox -e browser` installs) for the
tests of the HTML pages: a screenshot, the DOM as Chromium parsed it, bars counted in pixels.

Every node's bar has a frame of its own colour (``NODE_FRAME``) and all bars start at the same
x, so the frame's left edge is one vertical run of that colour per bar.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from PIL import Image


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("needs headless Chromium: apt-get install chromium (tools/system_deps.sh)")


def _run_chromium(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    # A clean environment: no LD_PRELOAD/ASAN_OPTIONS of a sanitizer run, a throw-away profile;
    # no network: the pages are self-contained.
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
        *args,
    ]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)


def screenshot(page: Path, png: Path, tmp_path: Path, height: int = 1000) -> Image.Image:
    """``page`` as Chromium draws it in a 1200 x ``height`` window."""
    proc = _run_chromium([f"--window-size=1200,{height}", f"--screenshot={png}", page.as_uri()],
                         tmp_path)  # fmt: skip
    assert png.exists(), f"chromium wrote no screenshot (exit {proc.returncode}):\n{proc.stderr}"
    return Image.open(png).convert("RGB")


def rendered_dom(page: Path, tmp_path: Path) -> str:
    """The document as Chromium parsed it (``--dump-dom``): what a reader's browser builds."""
    proc = _run_chromium(["--dump-dom", page.as_uri()], tmp_path)
    assert proc.returncode == 0 and "<body" in proc.stdout, proc.stderr
    return proc.stdout


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


class Elements(HTMLParser):
    """Every element of a document: its tag, class, attributes and text (its own and its
    children's), enough to count elements by class and read what they say."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[dict] = []
        self._open: list[dict] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        el = {"tag": tag, "class": dict(attrs).get("class") or "", "attrs": dict(attrs),
              "text": ""}  # fmt: skip
        self.elements.append(el)
        if tag not in ("meta", "br", "img", "input", "link", "hr"):
            self._open.append(el)

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            if self._open.pop()["tag"] == tag:
                break

    def handle_data(self, data: str) -> None:
        for el in self._open:
            el["text"] += data

    def having(self, tag: str, cls: str) -> list[dict]:
        """The ``tag`` elements whose class list holds ``cls``."""
        return [e for e in self.elements if e["tag"] == tag and cls in e["class"].split()]
