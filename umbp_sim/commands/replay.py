"""``umbp-sim replay DUMP [request] [--env K=V ...] [--json]``: a field failure, replayed."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from umbp_sim.diagnose.request_flags import add_request_arguments

    parser.add_argument(
        "dump",
        nargs="*",
        metavar="DUMP|DIR|GLOB",
        help="dump directory, .tar[.gz|.bz2|.xz] (hwloc-gather-topology, sosreport, umbp-sim "
        "collect), or text as pasted (a meminfo, whole or grep'd, numactl -H, sysfs values, "
        "sysctl lines...: docs/pastes.md); - reads one from stdin; several, a directory of dumps "
        "or a glob: a row per host (umbp_sim/diagnose/fleet.py); none, with --error LINE: the "
        "kinds of host on which that line happens",
    )
    add_request_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    parser.add_argument("--html", metavar="FILE", help="also write the report as an HTML page")


def print_diagnosis(d, as_json: bool, mode: str = "replay") -> None:  # type: ignore[no-untyped-def]
    from umbp_sim.diagnose.report import render_json, render_text
    from umbp_sim.vocabulary.printable import terminal

    print(render_json(d) if as_json else terminal(render_text(d, mode)))
    if not as_json:
        from umbp_sim.diagnose.picture import bars_for

        print(terminal(bars_for(d)), end="")


def run(args: argparse.Namespace) -> int:
    return with_external_allocator(args, _run)


def with_external_allocator(args: argparse.Namespace, body) -> int:  # type: ignore[no-untyped-def]
    """``body(args)`` with ``--run-timeout`` set for an external ``--allocator``'s runs and
    SIGTERM/SIGHUP ending its processes (exit 143/129); its server ended afterwards."""
    from umbp_sim.allocator_spec import is_external

    if not is_external(args.allocator):
        try:
            return int(body(args))
        finally:
            close_external_allocators()
    from umbp_sim.external.observe import set_run_timeout
    from umbp_sim.external.procs import ended_by_signals

    set_run_timeout(args.run_timeout)
    try:
        with ended_by_signals():
            return int(body(args))
    finally:
        close_external_allocators()


def close_external_allocators() -> None:
    """End the server process of an external ``--allocator`` (one per command), if one ran."""
    import sys

    if "umbp_sim.external.observe" in sys.modules:
        sys.modules["umbp_sim.external.observe"].close_runners()


def _run(args: argparse.Namespace) -> int:
    from umbp_sim.diagnose import diagnose
    from umbp_sim.diagnose.fleet import is_fleet
    from umbp_sim.diagnose.replay_request import RequestError, request_from_args
    from umbp_sim.dump import load_dump
    from umbp_sim.dump.stdin import STDIN, check_one_reader, stdin_source

    check_one_reader(args.dump, getattr(args, "error", None), "DUMP")
    if not args.dump and getattr(args, "symptom", None) is not None:
        raise RequestError(
            "DUMP: --symptom is asked of a host: give its dump (umbp-sim collect) or what was "
            "pasted of it (docs/pastes.md)"
        )
    if not args.dump and getattr(args, "error", None) is None:
        raise RequestError(
            "DUMP: give the host's dump (umbp-sim collect), or --error LINE alone for the kinds "
            "of host on which that line happens"
        )
    request = request_from_args(args)  # flags first: a usage error needs no dump
    if not args.dump:
        return _line_hosts(args, request)
    if is_fleet(args.dump):
        return replay_fleet_command(args.dump, request, args.json, args.html)
    from umbp_sim.diagnose.html_report import PageFile, write_html

    page = PageFile(args.html) if args.html else None  # before the work: a bad FILE fails first
    machine, facts = load_dump(stdin_source() if args.dump[0] == STDIN else args.dump[0])
    d = diagnose(machine, facts, request)
    write_html(d, page)
    print_diagnosis(d, args.json)
    return 0


def _line_hosts(args: argparse.Namespace, request) -> int:  # type: ignore[no-untyped-def]
    """``replay --error LINE`` with no dump: the kinds of host on which the line happens."""
    import json

    from umbp_sim.diagnose.hypotheses import line_hosts
    from umbp_sim.diagnose.report import line_hosts_json, render_line_hosts
    from umbp_sim.vocabulary.printable import terminal

    if args.html:
        from umbp_sim.diagnose.replay_request import RequestError

        raise RequestError("--html: a page is drawn for a dumped host; give its DUMP")
    machine, found = line_hosts(request)
    if args.json:
        print(json.dumps(line_hosts_json(request, machine, found), indent=2))
    else:
        print(terminal(render_line_hosts(request, machine, found)))
    return 0


def replay_fleet_command(args: list[str], request, as_json: bool, html: str | None = None) -> int:  # type: ignore[no-untyped-def]
    import json
    import sys

    from umbp_sim.diagnose.fleet import (
        expand_dumps,
        render_fleet_text,
        replay_fleet,
        tty_progress,
    )
    from umbp_sim.diagnose.html_report import PageFile, render_fleet_html
    from umbp_sim.errors import Terminated
    from umbp_sim.external.procs import ended_by_signals
    from umbp_sim.vocabulary.printable import terminal

    paths = expand_dumps(args)
    page = PageFile(html) if html else None  # before the work: an unwritable FILE fails first
    shown = tty_progress()
    done = 0

    def progress(count: int, total: int) -> None:
        nonlocal done
        done = count
        if shown is not None:
            shown(count, total)

    try:
        # SIGTERM/SIGHUP: the workers end with the pool (not left to fail on its pipes), exit
        # 143/129 as compare's
        with ended_by_signals():
            report = replay_fleet(paths, request, progress=progress)
        if page is not None:
            page.write(render_fleet_html(report))
    except Terminated as e:
        print(f"umbp-sim replay: {e} after {done} of {len(paths)} hosts (no report)",
              file=sys.stderr)  # fmt: skip
        return e.exit_code
    finally:
        if page is not None and not page.written:
            page.discard()
    print(
        json.dumps(report.to_json(), indent=1) if as_json else terminal(render_fleet_text(report))
    )
    return report.exit_code
