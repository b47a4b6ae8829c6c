"""``umbp-sim inspect DUMP [--json]``: what a dump says about the host, as umbp-sim models it."""

from __future__ import annotations

import argparse
import json

from umbp_sim.vocabulary.units import format_size


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "dump",
        help="dump directory, .tar[.gz|.bz2|.xz], or text as pasted (a meminfo, whole or "
        "grep'd, numactl -H, sysfs values...: docs/pastes.md); - reads one from stdin",
    )
    parser.add_argument("--json", action="store_true", help="print the model as JSON (bytes)")


def _size(v: object) -> str:
    if isinstance(v, int) and v >= 1 << 30 and v % (1 << 30):
        return f"{v / (1 << 30):.2f}GiB"
    if isinstance(v, int) and v >= 1 << 20 and v % (1 << 20):
        return f"{v / (1 << 20):.1f}MiB"
    return format_size(v) if isinstance(v, int) else ("-" if v is None else str(v))


def _om(v: object) -> str:
    return "-" if v is None else str(v)


def _nodes(ids: list[int] | None) -> str:
    """A node list as the kernel writes one (``0-3,6``); ``-`` when the dump has none."""
    if not ids:
        return "-"
    runs: list[list[int]] = []
    for i in sorted(ids):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def render_table(doc: dict, estimated_available: int | None = None) -> str:
    """The readable form of ``DumpFacts.to_json()``; ``estimated_available``: the MemAvailable
    the Machine uses when the dump has none (replay and preflight use it; a note says how)."""
    from umbp_sim.vocabulary.printable import printable

    available = _size(doc["mem_available"])
    if doc["mem_available"] is None and estimated_available is not None:
        available = f"- (estimated {_size(estimated_available)}: see the note)"
    out = [
        f"dump {printable(doc['name'])}: {doc['arch']}, kernel {printable(doc['kernel_version'])}"
        f" ({doc['kernel_version_source']}), page size {_size(doc['page_size'])}",
        f"memory: total {_size(doc['mem_total'])}, free {_size(doc['mem_free'])}, "
        f"available {available}, swap {_size(doc['swap_total'])}",
        f"commit: limit {_size(doc['commit_limit'])}, committed {_size(doc['committed_as'])}, "
        f"overcommit_memory {_om(doc['overcommit_memory'])}",
        f"limits: RLIMIT_AS {_size(doc['rlimit_as'])}, memory.max {_size(doc['memcg_max'])}",
    ]
    default = doc["default_hugepage_size"]
    if doc["hugepages"]:
        out.append("hugepages (pages)       total     free reserved  surplus overcommit")
        for size, p in doc["hugepages"].items():
            mark = " (default)" if int(size) == default else ""
            oc = doc["nr_overcommit_hugepages"].get(size)
            out.append(
                f"  {_size(int(size)) + mark:<18}{p['total']:>8} {p['free']:>8} "
                f"{p['reserved']:>8} {p['surplus']:>8} {'-' if oc is None else oc:>10}"
            )
    else:
        out.append("hugepages: none (no hugepage sizes in the dump)")
    if doc["nodes"]:
        out.append(
            f"nodes: possible {_nodes(doc['possible_nodes'])}, online {_nodes(doc['online_nodes'])}"
        )
        out.append("  node   mem_total    mem_free  hugepages total/free/surplus")
        for n in doc["nodes"]:
            pools = ", ".join(
                f"{_size(int(s))} {p['total']}/{p['free']}/{p['surplus']}"
                for s, p in n["hugepages"].items()
            )
            out.append(
                f"  {n['id']:>4} {_size(n['mem_total']):>11} {_size(n['mem_free']):>11}  "
                f"{pools or '-'}"
            )
    else:
        out.append("nodes: none in the dump (no sys/devices/system/node)")
    for note in doc["notes"]:
        out.append(f"note: {printable(note)}")
    out += _paste_lines(doc.get("paste"))
    return "\n".join(out)


def _paste_lines(paste: dict | None) -> list[str]:
    """A paste's values, each with the line it came from, and the lines not read."""
    from umbp_sim.vocabulary.printable import printable

    if paste is None:
        return []
    out = [f"read from the paste ({len(paste['facts'])} values):"]
    width = max((len(f"{p['line']}") for p in paste["facts"]), default=1)
    for p in paste["facts"]:
        out.append(
            f"  line {p['line']:>{width}}: {printable(p['fact'])} = {printable(p['value'])}"
            f"    <- {printable(p['text'].strip())}"
        )
    if paste["unread"]:
        out.append(f"not read ({len(paste['unread'])} lines in no form umbp-sim reads):")
        out += [f"  line {u['line']}: {printable(u['text'].strip())}" for u in paste["unread"]]
    return out


def run(args: argparse.Namespace) -> int:
    from umbp_sim.dump import load_dump
    from umbp_sim.dump.stdin import STDIN, stdin_source
    from umbp_sim.vocabulary.printable import terminal

    # building the Machine validates the dump too
    machine, facts = load_dump(stdin_source() if args.dump == STDIN else args.dump)
    doc = facts.to_json()
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(terminal(render_table(doc, machine.mem_available)))
    return 0
