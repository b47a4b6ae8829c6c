"""Command line: ``umbp-sim COMMAND ...``.

Each command lives in ``umbp_sim/commands/<name>.py`` and exposes ``HELP`` (one line),
``add_arguments(parser)`` and ``run(args) -> int``. Commands are imported only when used, so
``umbp-sim --help`` stays fast and a command's heavy imports (torch) cost nothing elsewhere.

Exit codes follow sysexits; ``EXIT_CODES`` lists every one (``umbp-sim --help`` prints it,
the README has the same table).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import textwrap

from umbp_sim.errors import UmbpSimError

EX_USAGE = 64
EX_DATAERR = 65
EX_SOFTWARE = 70
EX_CANTCREAT = 73

# Every exit status of every command (tests/test_package_fit.py checks that the code uses
# no other and that the README's table says the same).
EXIT_CODES: dict[int, str] = {
    0: "success: run: every scenario passed; probe: every backing behaved; preflight: the "
    "request gets what it asks for; replay, inspect, collect: done",
    1: "a negative answer: run: a scenario failed or none matched; probe: a backing did not "
    "get what it asked for; preflight: the request is demoted (or not bound to its node)",
    2: "preflight: the request fails or kills the process (replay of several dumps: the worst "
    "host's 0/1/2)",
    3: "preflight --verify: the real allocation on this host disagrees with the prediction",
    EX_USAGE: "bad usage: an unknown flag, a bad argument or environment value (one line names it)",
    EX_DATAERR: "bad input data: a scenario file, dump, meminfo file or fault rule (one line "
    "names the file and key)",
    EX_SOFTWARE: "an internal error: a bug in umbp-sim (one line; UMBP_SIM_TRACEBACK=1 prints "
    "the traceback)",
    66: "replay: a DUMP|DIR|GLOB argument names no dump",
    EX_CANTCREAT: "an output file cannot be written (collect's tarball, replay's --html page)",
    130: "interrupted (Ctrl-C)",
}


def _epilog() -> str:
    rows = [
        textwrap.fill(text, 88, initial_indent=f"  {code:>3}  ", subsequent_indent=" " * 7)
        for code, text in EXIT_CODES.items()
    ]
    return "exit status:\n" + "\n".join(rows)


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("umbp-sim")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "unknown (not installed)"


# name -> module under umbp_sim.commands
COMMANDS: dict[str, str] = {
    "probe": "probe",
    "run": "run",
    "inspect": "inspect",
    "collect": "collect",
    "replay": "replay",
    "preflight": "preflight",
    "profiles": "profiles",
    "build-allocator": "build_allocator",
    "compare": "compare",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # One line naming the flag, exit 64 (argparse's default is 2).
        self.exit(EX_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="umbp-sim",
        description="UMBP host-memory allocator simulator",
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"umbp-sim {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"umbp_sim.commands.{module_name}")
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = int(args._run(args))
        # Flush here, not at interpreter exit: a block-buffered stdout (a pipe, without
        # PYTHONUNBUFFERED) whose reader left would fail after main() with a traceback.
        sys.stdout.flush()
        return rc
    except UmbpSimError as e:
        # The tool's own errors name the file/line/flag; no traceback for bad input.
        print(f"umbp-sim {args.command}: {e}", file=sys.stderr)
        return getattr(e, "exit_code", EX_DATAERR)
    except BrokenPipeError:
        # `umbp-sim inspect ... | head`: the reader left; stop quietly like other Unix tools.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # a bug, not an answer: never exit 1 (preflight's "demoted")
        return internal_error(args.command, e)


def internal_error(command: str, e: BaseException) -> int:
    """One line (the traceback too with UMBP_SIM_TRACEBACK=1), exit 70 (EX_SOFTWARE)."""
    import traceback

    if os.environ.get("UMBP_SIM_TRACEBACK"):
        traceback.print_exception(e)
    text = " ".join(str(e).split())[:300]
    print(
        f"umbp-sim {command}: internal error: {type(e).__name__}: {text} "
        "(a bug in umbp-sim; UMBP_SIM_TRACEBACK=1 shows where)",
        file=sys.stderr,
    )
    return EX_SOFTWARE


if __name__ == "__main__":
    sys.exit(main())
