"""``umbp-sim preflight [request] [--root DUMP] [--json]``: will this request get what it asks?

Reads the live host (``umbp_sim.live_dump`` into a temporary tarball, then the dump reader) or a
dump, and answers in simulation: nothing is allocated. Exit 0: the request gets what it asks;
1: demoted to 4 KiB pages (or its NUMA binding dropped); 2: it fails or crashes.
"""

from __future__ import annotations

import argparse
import os
import tempfile


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from umbp_sim.diagnose.request_flags import add_request_arguments
    from umbp_sim.vocabulary.flag_types import cap_flag

    parser.add_argument(
        "--root", metavar="DUMP|-", help="a dump instead of the live host (-: from stdin)"
    )
    add_request_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    parser.add_argument("--html", metavar="FILE", help="also write the report as an HTML page")
    v = parser.add_argument_group(
        "--verify: perform the request for real (umbp_sim/diagnose/verify.py)"
    )
    v.add_argument(
        "--verify",
        action="store_true",
        help="then allocate it on this host in a child process (freed) and compare: exit 3 "
        "when prediction and reality disagree",
    )
    v.add_argument(
        "--verify-max-size",
        type=cap_flag,
        default=None,
        metavar="SIZE",
        help="largest request --verify performs (default 1GiB)",
    )
    v.add_argument(
        "--force", action="store_true", help="--verify even a request predicted to be OOM-killed"
    )


def live_host():  # type: ignore[no-untyped-def]
    """(Machine, DumpFacts) of this host, through collect and the dump reader."""
    from umbp_sim.dump import load_dump
    from umbp_sim.live_dump import collect

    with tempfile.TemporaryDirectory(prefix="umbp-sim-preflight-") as tmp:
        path = os.path.join(tmp, "live.tar")
        collect(path, "live")
        return load_dump(path)


def run(args: argparse.Namespace) -> int:
    from umbp_sim.commands.replay import with_external_allocator

    return with_external_allocator(args, _run)


def _run(args: argparse.Namespace) -> int:
    from umbp_sim.commands.replay import print_diagnosis
    from umbp_sim.diagnose import diagnose
    from umbp_sim.diagnose.replay_request import request_from_args
    from umbp_sim.dump import load_dump
    from umbp_sim.dump.stdin import STDIN, check_one_reader, stdin_source

    check_one_reader([args.root] if args.root else [], getattr(args, "error", None), "--root")
    request = request_from_args(args)
    if args.verify:
        return run_verify(args, request)
    from umbp_sim.diagnose.html_report import PageFile, write_html

    page = PageFile(args.html) if args.html else None  # before the work: a bad FILE fails first
    if args.root == STDIN:
        machine, facts = load_dump(stdin_source())
    else:
        machine, facts = load_dump(args.root) if args.root else live_host()
    d = diagnose(machine, facts, request)
    write_html(d, page, mode="preflight")
    print_diagnosis(d, args.json, mode="preflight")
    return d.exit_code


def run_verify(args: argparse.Namespace, request) -> int:  # type: ignore[no-untyped-def]
    import json

    from umbp_sim.diagnose import diagnose
    from umbp_sim.diagnose.report import render_json, render_text
    from umbp_sim.diagnose.verify import (
        DEFAULT_MAX_SIZE,
        VerifyError,
        check_request,
        is_oom_kill,
        refusal,
        render_verify_text,
        verify,
    )
    from umbp_sim.vocabulary.printable import terminal

    if args.root:
        raise VerifyError("--verify cannot be combined with --root: it allocates on this host")
    if args.html:
        raise VerifyError("--verify cannot be combined with --html: the page shows a prediction")
    cap = DEFAULT_MAX_SIZE if args.verify_max_size is None else args.verify_max_size
    check_request(request, cap)
    machine, facts = live_host()
    d = diagnose(machine, facts, request)
    if is_oom_kill(d) and not args.force:
        print(render_json(d) if args.json else terminal(render_text(d, mode="preflight")))
        raise VerifyError(refusal(d))
    v = verify(d, cap, args.force)
    if args.json:
        print(json.dumps({**json.loads(render_json(d)), "verify": v.to_json()}, indent=1))
    else:
        print(terminal(render_text(d, mode="preflight") + "\n\n" + render_verify_text(v)))
    return v.exit_code
