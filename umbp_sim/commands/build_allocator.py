"""``umbp-sim build-allocator SRC... [-I DIR] [-D NAME[=V]] [--link-arg ARG] -o OUT``."""

from __future__ import annotations

import argparse
import shlex


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sources", nargs="+", metavar="SRC", help="C++ sources (allocator + binding)")
    p.add_argument("-I", dest="includes", action="append", default=[], metavar="DIR")
    p.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME[=VALUE]")
    p.add_argument("-o", dest="output", required=True, metavar="OUT")
    p.add_argument(
        "--link-arg", dest="extra", action="append", default=[], metavar="ARG",
        help="one more compiler/linker argument (-lnuma, -O0, ...); repeatable",
    )  # fmt: skip
    p.add_argument("--cxx", default=None, help="compiler (default: $CXX or c++)")
    p.add_argument("--print-command", action="store_true", help="print the command line")


def run(args: argparse.Namespace) -> int:
    from umbp_sim.external.build import build_allocator

    cmd = build_allocator(
        args.sources, args.output, args.includes, args.defines, args.extra, args.cxx
    )
    if args.print_command:
        print(shlex.join(cmd))
    print(f"built {args.output}")
    return 0
