"""Replay one request on many dumps: a row per host, a summary by outcome, the worst exit status.

    paths = expand_dumps(["dumps/", "more/*.tar.gz"])    # FleetError (exit 66) when none match
    report = replay_fleet(paths, request)                  # parallel: one process per core
    print(render_fleet_text(report)); json.dumps(report.to_json())
    render_fleet_html(report)              # the HTML page: umbp_sim/diagnose/html_report.py

A host's row holds what the single-dump replay says first: the outcome (``demoted``, or ``ok``
with ``, not bound`` when its NUMA binding was dropped), the backing the buffer got, the cause
(the last the run decided: a kernel, allocator or sglang cause, not a dump note nor what the
outcome implies; none when the host got what it asked) and the first (best-ranked) fix's
commands. A dump that cannot be read is a row with outcome ``unreadable`` and the reader's one-
line error. Exit status: the worst host's, where 0 got what it asked, 1 demoted or not bound, 2
failed or crashed, 65 unreadable dump. A row also carries the host's picture (its nodes' pools
and memory against the request, :mod:`umbp_sim.diagnose.picture`) for the HTML page; the JSON
and the text table leave it out.
"""

from __future__ import annotations

import glob
import multiprocessing
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from umbp_sim.diagnose.picture import Picture
from umbp_sim.diagnose.replay_request import Request
from umbp_sim.errors import UmbpSimError
from umbp_sim.progress import Progress
from umbp_sim.vocabulary.exit_codes import EX_DATAERR, EX_NOINPUT
from umbp_sim.vocabulary.printable import printable

TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tbz", ".tar.xz", ".txz")
OUTCOME_ORDER = ("ok", "ok, not bound", "demoted", "failed", "crashed", "unreadable")
_GLOB_CHARS = ("*", "?", "[")


class FleetError(UmbpSimError):
    """No dump behind an argument (the message names it)."""

    exit_code = EX_NOINPUT


class FleetLinkError(UmbpSimError):
    """A symbolic link out of a fleet directory (the message names it and its target)."""

    exit_code = EX_DATAERR


def _inside(path: str, tree: str, walked: bool = True) -> None:
    """FleetLinkError when ``path`` (an entry of the fleet directory ``tree`` or of a directory
    inside it) is a symbolic link that resolves out of ``tree``: a fleet or must-gather
    directory never reaches out of itself (``rootfs -> /`` would be this host's /proc and
    /sys). Links inside it are fine. ``walked``: ``path``'s directory is inside (the walk
    never follows a link), so only ``path`` itself can lead out; else (a glob's match) every
    component is resolved."""
    if walked and not os.path.islink(path):
        return
    real = os.path.realpath(path)
    top = os.path.realpath(tree)
    if real != top and not real.startswith(top.rstrip("/") + "/"):
        try:
            target = os.readlink(path) if os.path.islink(path) else real
        except OSError:
            target = real
        raise FleetLinkError(
            f"{printable(path)}: a symbolic link out of {printable(tree)} (to "
            f"{printable(target)}): refused"
        )


def _glob_tree(pattern: str) -> str:
    """The directory a glob's fixed leading components name (``fleet`` for ``fleet/*/x.tgz``)."""
    parts = pattern.split("/")
    fixed = []
    for part in parts[:-1]:
        if any(c in part for c in _GLOB_CHARS):
            break
        fixed.append(part)
    return "/".join(fixed) or ("/" if pattern.startswith("/") else ".")


def _looks_like_dump_file(name: str) -> bool:
    return name.endswith(TAR_SUFFIXES) or name.endswith("meminfo")


def _is_dump_dir(path: str) -> bool:
    """A dump directory: proc/meminfo (or nodeN/meminfo) at its root, or one level down
    (``NAME/proc/meminfo``) when NAME is its only directory and nothing beside it looks like
    another dump."""
    if _has_machine_files(path):
        return True
    try:
        entries = os.listdir(path)
    except OSError:
        return False
    subdirs = [e for e in entries if os.path.isdir(os.path.join(path, e))]
    if len(subdirs) != 1 or any(_looks_like_dump_file(e) for e in entries):
        return False
    return _has_machine_files(os.path.join(path, subdirs[0]))


def _has_machine_files(path: str) -> bool:
    """proc/meminfo, or a nodeN/meminfo (a dump without proc/meminfo, dump/hwloc.py)."""
    if os.path.isfile(os.path.join(path, "proc", "meminfo")):
        return True
    return bool(glob.glob(os.path.join(glob.escape(path), "sys/devices/system/node/node*/meminfo")))


def _dumps_in(directory: str) -> list[str]:
    """The dumps a directory of dumps holds: tarballs, dump directories, ``*meminfo`` files;
    with none at its top, the node dumps of a must-gather (``_must_gather_nodes``). A link
    out of the directory is a FleetLinkError."""
    out = []
    for entry in sorted(os.listdir(directory)):
        p = os.path.join(directory, entry)
        _inside(p, directory)
        if os.path.isdir(p):
            if _is_dump_dir(p):
                out.append(p)
        elif _looks_like_dump_file(entry):
            out.append(p)
    return out or _must_gather_nodes(directory)


MUST_GATHER_DEPTH = 3  # must-gather.local.N/IMAGE-DIR/nodes/NODE: nodes/ is 2 levels down


def _must_gather_nodes(directory: str) -> list[str]:
    """A Kubernetes must-gather's node dumps: each ``nodes/NODE/`` (at most
    MUST_GATHER_DEPTH levels down) that is a dump directory, else the tarballs in it."""
    out: list[str] = []
    for root, dirs, _files in os.walk(directory):
        depth = os.path.relpath(root, directory).count(os.sep) + (root != directory)
        dirs.sort()
        if depth >= MUST_GATHER_DEPTH:
            dirs[:] = []
        if os.path.basename(root) != "nodes" or root == directory:
            continue
        for node in list(dirs):
            p = os.path.join(root, node)
            _inside(p, directory)
            if _is_dump_dir(p):
                out.append(p)
            else:
                tars = [os.path.join(p, e) for e in os.listdir(p) if e.endswith(TAR_SUFFIXES)]
                for t in tars:
                    _inside(t, directory)
                out += sorted(t for t in tars if os.path.isfile(t))
        dirs[:] = []  # a node's own directories are not searched further
    return out


def expand_dumps(args: Iterable[str]) -> list[str]:
    """Dump paths from arguments: a dump, a directory of dumps, or a glob (each in order)."""
    paths: list[str] = []
    seen: set[str] = set()  # a set: 40,000 dumps took 16 s as list lookups (quadratic)
    for arg in args:
        if os.path.exists(arg):
            found = [arg] if not os.path.isdir(arg) or _is_dump_dir(arg) else _dumps_in(arg)
            if not found:
                raise FleetError(f"{arg}: a directory with no dumps in it")
        elif any(c in arg for c in _GLOB_CHARS):
            found = sorted(glob.glob(arg))
            if not found:
                raise FleetError(f"{arg}: no file matches")
            tree = _glob_tree(arg)
            for p in found:  # a match is inside the directory the glob's fixed part names
                _inside(p, tree, walked=False)
        else:
            raise FleetError(f"{arg}: no such file or directory")
        for p in found:
            if p not in seen:
                seen.add(p)
                paths.append(p)
    return paths


def is_fleet(args: list[str]) -> bool:
    """More than one dump, a glob, or a directory of dumps (not a single dump)."""
    if len(args) != 1:
        return True
    arg = args[0]
    if os.path.isdir(arg):
        return not _is_dump_dir(arg)
    return not os.path.exists(arg) and any(c in arg for c in _GLOB_CHARS)


@dataclass
class HostRow:
    dump: str
    host: str
    outcome: str
    backing: str | None
    cause: str | None
    fix: str | None
    exit_code: int
    error: str | None = None
    picture: Picture | None = None  # the HTML page's bars (not in the JSON)
    # With --error (or --symptom): whether this host gives the line (the symptom), else the
    # single replay's hypotheses for it (their kinds, most likely first, and the first one's
    # cause).
    reproduces: bool | None = None
    asked: str = "error_line"  # or "symptom"
    hypotheses: tuple[str, ...] = ()
    hypothesis: str | None = None

    @property
    def line_cell(self) -> str | None:
        """The text table's "error line" cell."""
        if self.reproduces is None:
            return None
        if self.reproduces:
            return "reproduced"
        return "not reproduced; " + (", ".join(self.hypotheses) or "no hypothesis gives it")

    def to_json(self) -> dict[str, Any]:
        return {
            "dump": self.dump,
            "host": self.host,
            "outcome": self.outcome,
            "actual_backing": self.backing,
            "cause": self.cause,
            "fix": self.fix,
            "exit_code": self.exit_code,
            "error": self.error,
            "reproduces_error_line": self.reproduces if self.asked == "error_line" else None,
            "reproduces_symptom": self.reproduces if self.asked == "symptom" else None,
            "hypotheses": list(self.hypotheses),
            "first_hypothesis": self.hypothesis,
        }


@dataclass
class FleetReport:
    request: Request
    rows: list[HostRow] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return max((r.exit_code for r in self.rows), default=0)

    def summary(self) -> dict[str, int]:
        counts = Counter(r.outcome for r in self.rows)
        known = [o for o in OUTCOME_ORDER if o in counts]
        return {o: counts[o] for o in known + sorted(set(counts) - set(known))}

    def to_json(self) -> dict[str, Any]:
        return {
            "request": self.request.describe(),
            "allocator": self.request.allocator,
            "hosts": [r.to_json() for r in self.rows],
            "summary": self.summary(),
            "exit_code": self.exit_code,
        }


def replay_host(path: str, request: Request) -> HostRow:
    """One dump's row (the single-dump replay's first answers)."""
    from umbp_sim.diagnose import diagnose
    from umbp_sim.diagnose.picture import picture_of
    from umbp_sim.dump import load_dump

    try:
        machine, facts = load_dump(path)
    except UmbpSimError as e:
        return HostRow(path, "-", "unreadable", None, None, None, EX_DATAERR, str(e))
    d = diagnose(machine, facts, request)
    j = d.to_json()
    outcome = str(j["outcome"])
    if outcome == "ok" and not j.get("got_what_was_asked", True):
        outcome = "ok, not bound"
    # Causes the run decided (kernel, allocator, sglang), not the dump's notes nor what the
    # outcome implies (a demoted buffer's RDMA note): those come after the cause in the report.
    causes = [c.text for c in d.evidence if c.source not in ("dump", "outcome")]
    if d.exit_code == 0:
        causes = []  # it got what it asked: nothing to blame
    fixes = j.get("fixes") or []
    fix = None
    if fixes:
        commands = fixes[0].get("commands") or []
        fix = "; ".join(commands) if commands else str(fixes[0].get("action"))
    found = d.hypotheses.hypotheses if d.hypotheses is not None else []
    return HostRow(
        path,
        machine.name,
        outcome,
        j.get("actual_backing"),
        # the single replay's first: the one the outcome came from (explain.deciding_first)
        str(causes[0]) if causes else None,
        fix,
        d.exit_code,
        picture=picture_of(d),
        reproduces=(
            j["symptom"]["reproduced"] if j["symptom"] is not None else j["reproduces_error_line"]
        ),
        asked="symptom" if j["symptom"] is not None else "error_line",
        hypotheses=tuple(h.kind for h in found),
        hypothesis=found[0].cause if found else None,
    )


_REQUEST: Request | None = None


def _init_worker(request: Request) -> None:
    global _REQUEST
    _REQUEST = request


def _work(item: tuple[int, str]) -> tuple[int, HostRow]:
    assert _REQUEST is not None
    return item[0], replay_host(item[1], _REQUEST)


def _rows(paths: list[str], request: Request, jobs: int) -> Iterator[tuple[int, HostRow]]:
    if jobs <= 1 or len(paths) < 2:
        for i, p in enumerate(paths):
            yield i, replay_host(p, request)
        return
    # fork: the workers inherit the imports (the native module, the simulator) already made.
    ctx = multiprocessing.get_context("fork")
    chunk = max(1, min(16, len(paths) // (jobs * 8)))
    with ctx.Pool(jobs, _init_worker, (request,)) as pool:
        yield from pool.imap_unordered(_work, enumerate(paths), chunksize=chunk)
        # Its threads and workers ended before this process forks again (a later pool's fork
        # while this one's threads still ran hung the child on a lock under ASan's allocator).
        pool.close()
        pool.join()


def replay_fleet(
    paths: list[str],
    request: Request,
    jobs: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> FleetReport:
    """Replay ``request`` on every dump, ``jobs`` processes (default: every core)."""
    jobs = jobs or os.cpu_count() or 1
    # Warm the imports in the parent so forked workers share them.
    import umbp_sim.diagnose.explain  # noqa: F401
    import umbp_sim.diagnose.fix_search  # noqa: F401
    import umbp_sim.diagnose.simulate  # noqa: F401
    import umbp_sim.dump  # noqa: F401

    rows: list[HostRow | None] = [None] * len(paths)
    for done, (i, row) in enumerate(_rows(paths, request, jobs), 1):
        rows[i] = row
        if progress is not None:
            progress(done, len(paths))
    return FleetReport(request, [r for r in rows if r is not None])


def tty_progress(stream: Any = None) -> Callable[[int, int], None] | None:
    """``replay_fleet``'s progress as a :class:`umbp_sim.progress.Progress` line on ``stream``
    (stderr), erased at the end; None where that draws nothing (not a terminal, CI, TERM=dumb,
    UMBP_SIM_PROGRESS=0)."""
    line = Progress("replay: hosts", stream=stream)
    if not line.enabled:
        return None

    def show(done: int, total: int) -> None:
        line.total = total
        line.advance(n=done - line.done)
        if done == total:
            line.close()

    return show


def _cell(text: str | None, width: int) -> str:
    text = "-" if text is None else printable(text)  # a host name, a path: from the dump
    return text if len(text) <= width else text[: width - 1] + "…"


def render_fleet_text(report: FleetReport) -> str:
    header: tuple[str, ...] = ("host", "dump", "outcome", "backing", "cause", "smallest fix")
    widths: tuple[int, ...] = (24, 32, 14, 19, 64, 80)
    asked = "error line" if report.request.error_line is not None else (
        "symptom" if report.request.symptom is not None else None)  # fmt: skip
    with_line = asked is not None
    if with_line:  # which hosts give the line (symptom), what would make the others give it
        header, widths = (*header[:3], str(asked), *header[3:]), (*widths[:3], 48, *widths[3:])
    lines: list[tuple[str | None, ...]] = [header]
    for r in report.rows:
        cause = r.error if r.outcome == "unreadable" else r.cause
        dump = os.path.basename(r.dump.rstrip("/"))
        row: tuple[str | None, ...] = (r.host, dump, r.outcome, r.backing, cause, r.fix)
        lines.append((*row[:3], r.line_cell, *row[3:]) if with_line else row)
    cells = [tuple(_cell(c, w) for c, w in zip(line, widths, strict=True)) for line in lines]
    cols = [max(len(row[i]) for row in cells) for i in range(len(header))]
    out = [f"replay of {report.request.describe()} on {len(report.rows)} hosts", ""]
    out += ["  ".join(c.ljust(w) for c, w in zip(row, cols, strict=True)).rstrip() for row in cells]
    out.append("")
    summary = ", ".join(f"{n} {o}" for o, n in report.summary().items())
    out.append(f"summary: {summary} (exit {report.exit_code}: the worst host)")
    return "\n".join(out)
