"""``umbp-sim build-allocator (SRC... [--mori-binding] | --mori CHECKOUT) [-I DIR] [-D NAME[=V]]
[--link-arg ARG] -o OUT [--build-timeout SECONDS] [--build-memory SIZE] [--print-command]``.

With ``--mori``, a mori checkout's allocator is built with umbp-sim's binding of its header
(``umbp_sim/toolchain/mori_build.py``); with ``--mori-binding``, the sources given are built with
it, the header found through ``-I`` (an allocator with mori's API laid out another way). Every
build is loaded in a child process before "built" is said, and only then moved to OUT (a file
of the same name in a fresh directory beside it, renamed); an output that cannot be written or
is not a regular file is exit 73 before anything is compiled. Each compiler command is a bounded
process umbp-sim owns (``umbp_sim/toolchain/compiler.py``: ``--build-timeout``,
``--build-memory``, stdin /dev/null, ended with umbp-sim on any signal).
"""

from __future__ import annotations

import argparse
import shlex

from umbp_sim.vocabulary.flag_types import seconds_flag, size_flag
from umbp_sim.vocabulary.units import Size

DEFAULT_TIMEOUT = 600.0  # umbp_sim.toolchain.compiler's (which --help does not import)
MIN_MEMORY = 64 << 20  # below this no compiler starts


def memory_flag(value: str) -> Size:
    """``--build-memory``: a size a compiler can start in (at least 64MiB)."""
    size = size_flag(value)
    if size < MIN_MEMORY:
        raise argparse.ArgumentTypeError(
            f"{value.strip()[:40]} is too little for a compiler (at least 64MiB; default 4GiB)"
        )
    return size


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sources", nargs="*", metavar="SRC", help="C++ sources (allocator + binding)")
    p.add_argument(
        "--mori", metavar="CHECKOUT",
        help="a mori checkout: its host_mem_allocator.cpp with umbp-sim's Python binding",
    )  # fmt: skip
    p.add_argument(
        "--mori-binding", action="store_true",
        help="SRC... implement mori's HostMemAllocator (umbp/local/host_mem_allocator.h found "
        "through -I): build them with umbp-sim's Python binding of it",
    )  # fmt: skip
    p.add_argument("-I", dest="includes", action="append", default=[], metavar="DIR")
    p.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME[=VALUE]")
    p.add_argument("-o", dest="output", required=True, metavar="OUT")
    p.add_argument(
        "--link-arg", dest="extra", action="append", default=[], metavar="ARG",
        help="one more compiler/linker argument (-lnuma, -O0, ...); repeatable",
    )  # fmt: skip
    p.add_argument("--cxx", default=None, help="compiler (default: $CXX or c++)")
    p.add_argument(
        "--build-timeout", type=seconds_flag, default=DEFAULT_TIMEOUT, metavar="SECONDS",
        help="each compiler command's time limit, its whole process group ended past it "
        f"(default {DEFAULT_TIMEOUT:g})",
    )  # fmt: skip
    p.add_argument(
        "--build-memory", type=memory_flag, default=None, metavar="SIZE",
        help="the address space each compiler process may take (RLIMIT_AS; default 4GiB)",
    )  # fmt: skip
    p.add_argument(
        "--print-command", action="store_true",
        help="print the compiler command line and build nothing",
    )  # fmt: skip
    p.set_defaults(_build_parser=p)


def run(args: argparse.Namespace) -> int:
    from umbp_sim.external.procs import ended_by_signals
    from umbp_sim.toolchain.compiler import BuildLimits
    from umbp_sim.toolchain.mori_build import check_loads, mori_api_build, mori_build
    from umbp_sim.toolchain.wrapped_build import build_allocator, compile_command
    from umbp_sim.vocabulary.output_file import OutputFile

    if args.sources and args.mori:
        args._build_parser.error("give the sources (SRC ...) or --mori CHECKOUT, not both")
    if not args.sources and not args.mori:
        args._build_parser.error("give the sources (SRC ...) or --mori CHECKOUT")
    if args.mori and args.mori_binding:
        args._build_parser.error("--mori-binding goes with SRC ... (--mori has the binding)")
    limits = BuildLimits(timeout=args.build_timeout)
    if args.build_memory is not None:
        limits = BuildLimits(timeout=args.build_timeout, memory=int(args.build_memory))
    if not args.print_command:
        OutputFile(args.output, "-o", dash=False)  # before anything is compiled: exit 73
    with ended_by_signals():  # SIGTERM, SIGHUP: the compiler's group ended, nothing placed
        sources, includes, defines, extra = args.sources, args.includes, args.defines, args.extra
        plan = None
        if args.mori:
            plan = mori_build(args.mori, args.output, args.cxx, limits)
            includes = [*plan.includes, *includes]
        elif args.mori_binding:
            plan = mori_api_build(args.sources, includes, args.output, args.cxx, limits)
        if plan is not None:
            sources = plan.sources
            defines = [*plan.defines, *defines]
            extra = [*plan.extra, *extra]
        if args.print_command:
            cmd = compile_command(sources, args.output, includes, defines, extra, args.cxx)
            print(shlex.join(cmd))
            return 0
        build_allocator(
            sources, args.output, includes, defines, extra, args.cxx, limits,
            check=lambda staged: check_loads(args.output, staged),
        )  # fmt: skip
    print(f"built {args.output}")
    return 0
