"""``umbp-sim probe``: allocate and free one buffer of each backing on this host, show the result.

Each backing is an engine ``Measure`` run: the real kernel, in a fresh process of its own, so
every once-only warning shows. Exit 0 when every backing got what it asked for, 1 when one did
not: an invalid handle, a process killed by a signal, hugetlb demoted to 4 KiB pages, or a
buffer not on the ``--numa-node`` asked for; 64 for a bad option.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from umbp_sim.allocator_profiles import FIELD_PROFILE, FIXED_PROFILE, mori_log_lines
from umbp_sim.allocator_spec import allocator_flag
from umbp_sim.errors import UmbpSimError
from umbp_sim.vocabulary.backing import BACKINGS, is_demoted
from umbp_sim.vocabulary.exit_codes import EX_USAGE
from umbp_sim.vocabulary.flag_types import node_flag, seconds_flag
from umbp_sim.vocabulary.units import SizeError, format_size, parse_size

if TYPE_CHECKING:
    from umbp_sim.engine.record import RunRecord


HEADER = ("requested", "size", "actual backing", "alignment", "mapped size", "node", "warnings")


class ProbeUsageError(UmbpSimError):
    exit_code = EX_USAGE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", default="64MiB", help="bytes per buffer (4096, 64MiB, 2GiB)")
    parser.add_argument(
        "--hugepage-size", default="2MiB", help="hugepage size for the hugetlb backings"
    )
    parser.add_argument(
        "--numa-node",
        type=node_flag,
        default=-1,
        help="bind each buffer to this node (-1: no binding)",
    )
    parser.add_argument(
        "--allocator",
        type=allocator_flag,
        default=FIXED_PROFILE,
        metavar="NAME|PATH|MODULE",
        help=f"allocator profile: {FIXED_PROFILE} (default: mori plus umbp-sim's fixes) or "
        f"{FIELD_PROFILE} (alias mori: the field's); or an external build: a built .so with "
        "mori's Python API, or an importable module (each backing in a run of its own process)",
    )
    parser.add_argument(
        "--run-timeout",
        type=seconds_flag,
        default=None,
        metavar="SECONDS",
        help="an external --allocator: the time limit of each backing's run and of its import "
        "(default 60)",
    )


def _sizes(args: argparse.Namespace) -> tuple[int, int]:
    try:
        size = parse_size(args.size, "--size")
        hugepage_size = parse_size(args.hugepage_size, "--hugepage-size")
    except SizeError as e:
        raise ProbeUsageError(str(e)) from None
    if size == 0:
        raise ProbeUsageError("--size: must be at least 1 byte, got 0")
    if size >= 2**64 or hugepage_size >= 2**64:
        raise ProbeUsageError("--size/--hugepage-size: must be below 2**64 bytes")
    return size, hugepage_size


def probe(
    size: int, hugepage_size: int, numa_node: int, allocator: str = FIXED_PROFILE
) -> list[dict[str, object]]:
    """One row per backing: what was asked, what came back, which warnings were logged. Each
    backing is an engine ``Measure`` run (the real kernel, a fresh process of its own, so every
    once-only warning shows) on ``allocator`` (a profile or an external build)."""
    from umbp_sim import run_router
    from umbp_sim.commands.preflight import live_host
    from umbp_sim.engine.spec import Measure, Run
    from umbp_sim.request import AllocRequest

    machine, _ = live_host()
    rows = []
    for name in BACKINGS:
        req = AllocRequest(size, name, hugepage_size, numa_node, True)
        rec = run_router.run(Run(machine, Measure(req), allocator=allocator))
        handle = rec.handle_after_alloc or {}
        ok = rec.outcome in ("ok", "demoted")
        rows.append({
            "requested": name,
            "size": size,
            "ok": ok,
            "actual_backing": rec.actual_backing if ok else None,
            "alignment": handle.get("actual_alignment") if ok else None,
            "mapped_size": rec.mapped_size if ok else None,
            "node": handle.get("numa_node", rec.bound_node) if ok else None,
            "warnings": _logged(allocator, rec.allocator_warnings or rec.warnings),
            "failed_as": _failed_as(rec),
        })  # fmt: skip
    return rows


def _logged(allocator: str, warnings: list[str]) -> list[str]:
    """The warnings the allocator's log shows: under the field's profile, mori's log level
    decides (nothing at its default level, as a build of mori shows)."""
    if allocator == FIELD_PROFILE and not mori_log_lines(warnings, os.environ):
        return []
    return list(warnings)


def _failed_as(rec: RunRecord) -> str:
    """What the table says of a backing that got no buffer."""
    if rec.outcome == "crashed":
        return f"CRASHED ({rec.signal})"
    return {"timeout": "TIMED OUT", "could-not-run": "NOT RUN"}.get(rec.outcome, "FAILED")


def _table(rows: list[dict[str, object]]) -> str:
    lines: list[tuple[str, ...]] = [HEADER]
    notes: list[str] = []
    for row in rows:
        refs = []
        for text in row["warnings"]:  # type: ignore[attr-defined]
            notes.append(text)
            refs.append(f"[{len(notes)}]")
        ok = bool(row["ok"])
        node = row["node"]
        lines.append(
            (
                str(row["requested"]),
                format_size(row["size"]),  # type: ignore[arg-type]  # in the user's unit
                str(row["actual_backing"]) if ok else str(row.get("failed_as", "FAILED")),
                format_size(int(row["alignment"])) if ok else "-",  # type: ignore[call-overload]
                format_size(int(row["mapped_size"])) if ok else "-",  # type: ignore[call-overload]
                "-" if not ok or node == -1 else str(node),
                " ".join(refs) or "-",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEADER))]
    out = [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    ]
    out.extend(f"[{i}] {text}" for i, text in enumerate(notes, 1))
    return "\n".join(out)


def got_what_it_asked(row: dict[str, object], numa_node: int) -> bool:
    """A valid buffer of the backing asked for, on the node asked for (when one was)."""
    if not row["ok"] or is_demoted(str(row["requested"]), str(row["actual_backing"])):
        return False
    return numa_node == -1 or row["node"] == numa_node


def run(args: argparse.Namespace) -> int:
    from umbp_sim.commands.replay import with_external_allocator

    size, hugepage_size = _sizes(args)
    return with_external_allocator(args, lambda a: _run(a, size, hugepage_size))


def _run(args: argparse.Namespace, size: int, hugepage_size: int) -> int:
    rows = probe(size, hugepage_size, args.numa_node, args.allocator)
    print(_table(rows))
    return 0 if all(got_what_it_asked(row, args.numa_node) for row in rows) else 1
