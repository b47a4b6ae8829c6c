"""The HTML pages of ``--html FILE``: a replay (:func:`render_html`), a fleet replay
(:func:`render_fleet_html`), in the frame every page of umbp-sim's has (``umbp_sim.html_page``:
compare's page uses it too).

No scripts, no external files: inline CSS only, so a page can be attached to a ticket and
opened anywhere. Every text is escaped (host names, dump paths and warning texts come from
untrusted dumps and allocators). Each node is one ``div.node-bar`` (its segments as
``div.seg``), the request one ``div.request-bar`` on the same scale; a replay's ``details``
(the text report) follow in a ``pre``.

>>> from umbp_sim.machine import Machine
>>> from umbp_sim.diagnose.picture import picture
>>> m = Machine.x86_64(nodes=2, mem_per_node="8GiB", hugepages={"2MiB": 512})
>>> page = render_html(picture(m, [1 << 30], "AnonymousHugetlb", 2 << 20, 0, "ok"))
>>> page.count('class="node-bar'), page.count('class="request-bar')
(2, 1)
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from umbp_sim.diagnose.picture import (
    NEED_END,
    SEGMENTS,
    Picture,
    describe_node,
    describe_request,
    human,
    page_size_name,
    picture_of,
)
from umbp_sim.html_page import (
    NEED_MARK,
    NODE_FRAME as NODE_FRAME,
    REQUEST_COLOR as REQUEST_COLOR,
    PageFile as PageFile,
    escaped as escaped,
    page as page,
)
from umbp_sim.vocabulary.output_file import OutputFileError

if TYPE_CHECKING:
    from umbp_sim.diagnose import Diagnosis
    from umbp_sim.diagnose.fleet import FleetReport
    from umbp_sim.diagnose.report import FixLine, Sections

COLORS = {
    "pool_free": "#2e7d32",
    "pool_used": "#a5d6a7",
    "other_pools": "#8e24aa",
    "mem_used": "#90a4ae",
    "mem_free": "#eceff1",
}


def _pct(nbytes: int, scale: int) -> str:
    return f"{100.0 * nbytes / scale:.4f}%"


def bars_html(pic: Picture) -> str:
    """A ``div.row`` per node (its bar), the request's bar, the legend."""
    esc = escaped
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
        f'<span><i class="swatch" style="background:{NEED_MARK}"></i>{esc(NEED_END[1])}</span>'
    )
    return "\n".join(rows) + f'\n<p class="legend">{legend}</p>'


def render_html(pic: Picture, details: str = "", title: str = "umbp-sim replay") -> str:
    """The bars alone: the request line, a bar per node, the request's bar, a legend, and
    ``details`` as preformatted text (a replay's page is :func:`render_diagnosis_html`)."""
    esc = escaped
    pre = f"<pre>{esc(details)}</pre>" if details else ""
    body = f'<p class="summary">{esc(describe_request(pic))}</p>\n{bars_html(pic)}\n{pre}'
    return page(f"{title}: {pic.host}", body)


OUTCOME_COLORS = {"ok": "#2e7d32", "demoted": "#ef6c00", "failed": "#c62828", "crashed": "#c62828"}


def render_diagnosis_html(s: Sections, pic: Picture | None, title: str = "umbp-sim replay") -> str:
    """A replay's (or preflight's) page: the sections of the text report as headed sections (the
    outcome coloured, each fix with its commands as code), the bars per node between them."""
    esc = escaped

    def items(lines: list[str], cls: str = "") -> str:
        return f"<ul{cls}>" + "".join(f"<li>{esc(x)}</li>" for x in lines) + "</ul>"

    def fixes(fs: list[FixLine], ordered: bool) -> str:
        tag = "ol" if ordered else "ul"
        rows = "".join(
            f"<li>{esc(f.action)}"
            + "".join(f"<pre class='cmd'><code>{esc(c)}</code></pre>" for c in f.commands)
            + "".join(f"<div class='boot'>after a reboot too: {esc(p)}</div>" for p in f.persistent)
            + f"<div class='after'>simulated: {esc(f.outcome_after)}</div>"
            + (f"<div class='after'>leaves: {esc(f.margin)}</div>" if f.margin else "")
            + (
                "<div class='after'>host-wide, every workload on the host lives with: "
                f"{esc('; '.join(f.host_wide))}</div>"
                if f.host_wide
                else ""
            )
            + (f"<div class='after unsafe'>{esc(f.safety)}</div>" if f.safety else "")
            + "</li>"
            for f in fs
        )
        return f"<{tag} class='fixes'>{rows}</{tag}>"

    color = OUTCOME_COLORS.get(s.outcome, "#455a64")
    head = [f"<p class='summary'>{esc(s.heading)}</p>",
            f"<p>on {esc(s.host)}<br>allocator: {esc(s.allocator)}"
            + (f"<br>sglang: {esc(s.sglang)}" if s.sglang else "") + "</p>"]  # fmt: skip
    body = head + [
        f"<h2>1. {esc(s.saw_title)}</h2>",
        f"<p class='outcome' style='border-color:{color}'>"
        f"<b style='color:{color}'>{esc(s.saw)}</b></p>",
        items(s.saw_lines) if s.saw_lines else "",
    ]
    if pic is not None:
        body += ["<h2>memory per node</h2>", bars_html(pic)]
    body += ["<h2>2. why</h2>"]
    if s.hypotheses_intro is not None:
        body.append(f"<p>{esc(s.hypotheses_intro)}</p>")
        rows = "".join(
            f"<li>{esc(h.cause)}<div class='after'>simulated: {esc(h.verified)}</div>"
            + (f"<div class='after'>just past it: {esc(h.beyond)}</div>" if h.beyond else "")
            + "".join(f"<div class='boot'>to confirm: {esc(c)}</div>" for c in h.collect)
            + "".join(f"<div class='boot'>to fix: {esc(c)}</div>" for c in h.fix)
            + "</li>"
            for h in s.hypotheses
        )
        body.append(f"<ol class='hypotheses'>{rows}</ol>" if rows else "")
        if s.ruled_out:
            body += [f"<h3>does not give {esc(s.ruled_out_of)} (simulated)</h3>",
                     items(s.ruled_out)]  # fmt: skip
        body.append("<h3>on the host as dumped</h3>")
    body.append(items(s.causes or ["nothing to explain"]))
    body += ["<h2>3. what to change</h2>"]
    if s.no_fix is not None:
        body.append(f"<p>{esc(s.no_fix)}</p>")
    safe = [f for f in s.fixes if not f.safety]
    unsafe = [f for f in s.fixes if f.safety]
    if safe:
        body.append(fixes(safe, ordered=True))
    if unsafe:
        body += ["<h3>unsafe, not recommended (the figure says why)</h3>", fixes(unsafe, False)]
    if s.not_helping:
        body += ["<h3>tried in simulation, does not help</h3>", fixes(s.not_helping, False)]
    if s.with_fixes is not None:
        body += ["<h2>4. with umbp-sim's allocator fixes (--allocator umbp-sim)</h2>",
                 f"<p>simulated: {esc(s.with_fixes)}</p>"]  # fmt: skip
    return page(f"{title}: {s.host}", "\n".join(x for x in body if x))


FLEET_COLUMNS = ("host", "dump", "outcome", "backing", "cause", "smallest fix")


def render_fleet_html(report: FleetReport, title: str = "umbp-sim replay") -> str:
    """A fleet replay: a row per host (``table.hosts``, ``tr.host``), the summary by outcome
    (``table.summary``), then each host's bars (``section.host-bars``)."""
    esc = escaped

    def cell(text: str | None) -> str:
        return f"<td>{esc('-' if text is None else text)}</td>"

    # as the text table: which give the line (the symptom)
    asked = "error line" if report.request.error_line is not None else "symptom"
    with_line = report.request.error_line is not None or report.request.symptom is not None
    columns = FLEET_COLUMNS[:3] + (asked,) * with_line + FLEET_COLUMNS[3:]
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    rows = []
    for r in report.rows:
        cause = r.error if r.outcome == "unreadable" else r.cause
        dump = os.path.basename(r.dump.rstrip("/"))
        line = (r.line_cell,) if with_line else ()
        cells = "".join(cell(c) for c in (r.host, dump, r.outcome, *line, r.backing, cause, r.fix))
        rows.append(f'<tr class="host" data-outcome="{esc(r.outcome)}">{cells}</tr>')
    summary = "".join(
        f'<tr class="outcome"><td>{esc(o)}</td><td>{n}</td></tr>'
        for o, n in report.summary().items()
    )
    sections = []
    for r in report.rows:
        if r.picture is None:
            why = r.error or "nothing to draw for this request"
            bars = f'<p class="text">{esc(why)}</p>'
        else:
            bars = f'<p class="summary">{esc(describe_request(r.picture))}</p>\n' + bars_html(
                r.picture
            )
        sections.append(
            f'<section class="host-bars"><h2>{esc(r.host)} '
            f'<span class="count">{esc(r.dump)}</span></h2>\n{bars}</section>'
        )
    what = report.request.describe()
    body = (
        f'<p class="summary">{esc(what)} on {len(report.rows)} hosts</p>\n'
        f'<table class="hosts"><tr>{head}</tr>\n' + "\n".join(rows) + "</table>\n"
        "<h2>summary by outcome</h2>\n"
        f'<table class="summary"><tr><th>outcome</th><th>hosts</th></tr>{summary}</table>\n'
        f'<p class="exit">exit {report.exit_code}: the worst host</p>\n'
        "<h2>memory per node, per host</h2>\n" + "\n".join(sections)
    )
    return page(f"{title}: {len(report.rows)} hosts", body)


# The --html page is an output file as every other (umbp_sim/vocabulary/output_file.py); the names
# stay.
ReportWriteError = OutputFileError


def write_html(d: Diagnosis, page: PageFile | str | None, mode: str = "replay") -> None:
    """Write the HTML report of a diagnosis to ``page`` (a PageFile checked before the work, or
    a path; nothing if None); ``mode`` heads it as a replay's or a preflight's."""
    if page is None:
        return
    from umbp_sim.diagnose.report import sections

    if not isinstance(page, PageFile):
        page = PageFile(page)
    pic = picture_of(d)
    if pic is None:
        raise ReportWriteError(f"--html {page.path}: the request has no buffer sizes to draw")
    page.write(render_diagnosis_html(sections(d, mode), pic))
