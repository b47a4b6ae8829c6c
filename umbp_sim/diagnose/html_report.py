"""The bars of :mod:`umbp_sim.diagnose.picture` as one self-contained HTML page.

No scripts, no external files: inline CSS only, so the page can be attached to a ticket and
opened anywhere. Each node is one ``div.node-bar`` (its segments as ``div.seg``), the request
one ``div.request-bar`` on the same scale; ``details`` (the text report) follows in a ``pre``.

>>> from umbp_sim.machine import Machine
>>> from umbp_sim.diagnose.picture import picture
>>> m = Machine.x86_64(nodes=2, mem_per_node="8GiB", hugepages={"2MiB": 512})
>>> page = render_html(picture(m, [1 << 30], "AnonymousHugetlb", 2 << 20, 0, "ok"))
>>> page.count('class="node-bar'), page.count('class="request-bar')
(2, 1)
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from umbp_sim.diagnose.picture import (
    SEGMENTS,
    Picture,
    describe_node,
    describe_request,
    human,
    page_size_name,
    picture_of,
)
from umbp_sim.errors import UmbpSimError

if TYPE_CHECKING:
    from umbp_sim.diagnose import Diagnosis

COLORS = {
    "pool_free": "#2e7d32",
    "pool_used": "#a5d6a7",
    "other_pools": "#8e24aa",
    "mem_used": "#90a4ae",
    "mem_free": "#eceff1",
}
NODE_FRAME = "#1a237e"  # the border of every node's bar (tests count bars by it)
REQUEST_COLOR = "#e65100"
NEED_MARK = "#b71c1c"

_CSS = f"""
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #212121; background: #fff; }}
h1 {{ font-size: 18px; margin: 0 0 8px; }}
.row {{ display: flex; align-items: center; margin: 14px 0; }}
.label {{ flex: none; width: 110px; font-weight: 600; }}
.node-bar, .request-bar {{ position: relative; display: flex; width: 560px; height: 26px;
  flex: none; box-sizing: border-box; background: #fff; }}
.node-bar {{ border: 2px solid {NODE_FRAME}; }}
.request-bar {{ border: 2px solid {REQUEST_COLOR}; }}
.seg {{ height: 100%; }}
.need {{ background: {REQUEST_COLOR}; height: 100%; }}
.mark {{ position: absolute; top: -5px; bottom: -5px; width: 3px; background: {NEED_MARK}; }}
.text {{ margin-left: 14px; }}
.target .label::after {{ content: " \\2190 bound"; font-weight: 400; color: {NEED_MARK}; }}
.legend span {{ display: inline-block; margin-right: 16px; }}
.swatch {{ display: inline-block; width: 12px; height: 12px; margin-right: 4px;
  vertical-align: -1px; border: 1px solid #999; }}
pre {{ background: #f5f5f5; padding: 12px; white-space: pre-wrap; }}
"""


def _pct(nbytes: int, scale: int) -> str:
    return f"{100.0 * nbytes / scale:.4f}%"


def render_html(pic: Picture, details: str = "", title: str = "umbp-sim replay") -> str:
    """The page: the request line, a bar per node, the request's bar, a legend, ``details``."""
    esc = html.escape
    size = page_size_name(pic.hugepage_size)
    rows = []
    for n in pic.nodes:
        segs = "".join(
            f'<div class="seg {s.kind}" style="width:{_pct(s.nbytes, pic.scale)};'
            f'background:{COLORS[s.kind]}" title="{esc(s.kind)} {esc(human(s.nbytes))}"></div>'
            for s in n.segments
            if s.nbytes
        )
        mark = ""
        if n.target and pic.needed:
            start = 0 if pic.hugetlb else sum(s.nbytes for s in n.segments[:-1])
            at = min(pic.scale, start + pic.needed)
            mark = f'<div class="mark" style="left:calc({_pct(at, pic.scale)} - 2px)"></div>'
        rows.append(
            f'<div class="row node{" target" if n.target else ""}" data-node="{n.node}">'
            f'<span class="label">node {n.node}</span>'
            f'<div class="node-bar">{segs}{mark}</div>'
            f'<span class="text">{esc(describe_node(pic, n))}</span></div>'
        )
    rows.append(
        '<div class="row request"><span class="label">request</span>'
        f'<div class="request-bar"><div class="need" style="width:'
        f'{_pct(min(pic.needed, pic.scale), pic.scale)}"></div></div>'
        f'<span class="text">{esc(human(pic.needed))}</span></div>'
    )
    legend = "".join(
        f'<span><i class="swatch" style="background:{COLORS[kind]}"></i>'
        f"{esc(text.format(size=size))}</span>"
        for kind, _, text in SEGMENTS
    )
    legend += (
        f'<span><i class="swatch" style="background:{NEED_MARK}"></i>'
        "where the request's need ends on its node</span>"
    )
    body = "\n".join(rows)
    pre = f"<pre>{esc(details)}</pre>" if details else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>{esc(title)}: {esc(pic.host)}</title>
<style>{_CSS}</style></head>
<body>
<h1>{esc(title)}: {esc(pic.host)}</h1>
<p class="summary">{esc(describe_request(pic))}</p>
{body}
<p class="legend">{legend}</p>
{pre}
</body></html>
"""


class ReportWriteError(UmbpSimError):
    """The HTML report cannot be written (exit 73, like collect's output)."""

    exit_code = 73


def write_html(d: Diagnosis, path: str | None) -> None:
    """Write the HTML report of a diagnosis to ``path`` (nothing if ``path`` is None)."""
    if path is None:
        return
    from umbp_sim.diagnose.report import render_text

    pic = picture_of(d)
    if pic is None:
        raise ReportWriteError(f"--html {path}: the request has no buffer sizes to draw")
    page = render_html(pic, details=render_text(d))
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(page)
    except OSError as e:
        raise ReportWriteError(f"--html {path}: cannot write: {e.strerror}") from None
