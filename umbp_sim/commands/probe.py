"""``umbp-sim probe``: allocate and free one buffer of each backing on this host, show the result.

Runs on a fresh LinuxKernel so every once-only warning shows. Exit 0 when every backing got what
it asked for, 1 when one did not: an invalid handle, hugetlb demoted to 4 KiB pages, or a buffer
not on the ``--numa-node`` asked for; 64 for a bad option.
"""

from __future__ import annotations

import argparse
import logging

from umbp_sim.backing import BACKINGS, is_demoted
from umbp_sim.errors import UmbpSimError
from umbp_sim.exit_codes import EX_USAGE
from umbp_sim.flag_types import node_flag
from umbp_sim.log_capture import LogCapture
from umbp_sim.units import SizeError, format_size, parse_size

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


def probe(size: int, hugepage_size: int, numa_node: int) -> list[dict[str, object]]:
    """One row per backing: what was asked, what came back, which warnings were logged."""
    import umbp_sim._native as _native
    from umbp_sim.allocator import UMBPHostBufferBacking, UMBPHostMemAllocator

    allocator = UMBPHostMemAllocator(kernel=_native.LinuxKernel())
    logger = logging.getLogger("umbp_sim.allocator")
    rows = []
    for name in BACKINGS:
        collect = LogCapture(logging.INFO)
        propagate = logger.propagate
        logger.addHandler(collect)
        logger.propagate = False
        try:
            handle = allocator.alloc(
                size, getattr(UMBPHostBufferBacking, name), hugepage_size, numa_node, True
            )
            row: dict[str, object] = {
                "requested": name,
                "size": size,
                "ok": bool(handle),
                "actual_backing": handle.actual_backing.name if handle else None,
                "alignment": handle.actual_alignment if handle else None,
                "mapped_size": handle.mapped_size if handle else None,
                "node": handle.numa_node if handle else None,
            }
            allocator.free(handle)
        finally:
            logger.removeHandler(collect)
            logger.propagate = propagate
        row["warnings"] = collect.messages
        rows.append(row)
    return rows


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
                str(row["actual_backing"]) if ok else "FAILED",
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
    size, hugepage_size = _sizes(args)
    rows = probe(size, hugepage_size, args.numa_node)
    print(_table(rows))
    return 0 if all(got_what_it_asked(row, args.numa_node) for row in rows) else 1
