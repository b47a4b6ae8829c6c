"""The frame of every HTML page umbp-sim writes (replay's, preflight's, a fleet's, compare's):
:func:`page` (the one stylesheet, the title, a body), :func:`escaped` (every text a page shows)
and :class:`PageFile` (its ``--html FILE``). Below the pages that use it, so compare's page and
replay's share it and neither imports the other's (tests/test_layers.py).

No scripts, no external files: inline CSS only, so a page can be attached to a ticket and
opened anywhere.
"""

from __future__ import annotations

import html

from umbp_sim.vocabulary.output_file import OutputFile
from umbp_sim.vocabulary.printable import markup

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
pre.cmd {{ padding: 4px 8px; margin: 4px 0; }}
.outcome {{ border-left: 6px solid; padding: 4px 10px; }}
.after {{ color: #546e7a; }}
h3 {{ font-size: 14px; margin: 14px 0 4px; }}
h2 {{ font-size: 16px; margin: 22px 0 6px; }}
table {{ border-collapse: collapse; margin: 8px 0; }}
th, td {{ border: 1px solid #cfd8dc; padding: 3px 8px; text-align: left; vertical-align: top; }}
th {{ background: #eceff1; }}
td {{ overflow-wrap: anywhere; max-width: 520px; }}
.count {{ font-weight: 400; color: #546e7a; }}
"""


def escaped(text: str) -> str:
    """``text`` for a page: control characters visible (``markup``: an allocator's warning or a
    dump's host name may hold any), then ``<&>"'`` escaped."""
    return html.escape(markup(text))


def page(title: str, body: str) -> str:
    """A self-contained page: ``title`` (escaped here) over ``body`` (HTML, escaped by the
    caller)."""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>{escaped(title)}</title>
<style>{_CSS}</style></head>
<body>
<h1>{escaped(title)}</h1>
{body}
</body></html>
"""


class PageFile(OutputFile):
    """The ``--html FILE`` of a command (or ``--junit``'s): checked before the work, written
    only when there is a page (:class:`umbp_sim.vocabulary.output_file.OutputFile`)."""

    def __init__(self, path: str, flag: str = "--html") -> None:
        super().__init__(path, flag)
