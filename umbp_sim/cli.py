"""Command line: ``umbp-sim COMMAND ...``.

Each command lives in ``umbp_sim/commands/<name>.py`` and exposes ``add_arguments(parser)`` and
``run(args) -> int``; its one-line help is in ``COMMANDS`` here. Only the command that runs is
imported (its module imports what its work needs inside ``run``), so ``umbp-sim --help``, a
usage error or a command's ``--help`` load neither the compiled extension nor torch
(tests/test_cli_imports.py, bench/bench_cli_startup.py).

Exit codes follow sysexits; ``EXIT_CODES`` lists every one (``umbp-sim --help`` prints it,
docs/commands.md has the same table).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import textwrap

from umbp_sim.errors import Terminated, UmbpSimError
from umbp_sim.vocabulary.exit_codes import (
    EX_DATAERR,
    EX_INTERRUPTED,
    EX_OK,
    EX_SOFTWARE,
    EX_USAGE,
    EXIT_CODES,
)

# Every exit status of every command: declared in umbp_sim/vocabulary/exit_codes.py
# (tests/test_package_fit.py checks that the code uses no other and that docs/commands.md's table
# says the same).


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


class Command:
    """A command: its module under ``umbp_sim.commands`` (``add_arguments``, ``run``) and its
    one-line help (here, so ``umbp-sim --help`` imports no command). A plain class: the
    dataclasses module alone would double the start-up's imports."""

    __slots__ = ("module", "help")

    def __init__(self, module: str, help: str) -> None:
        self.module = module
        self.help = help


COMMANDS: dict[str, Command] = {
    "probe": Command(
        "probe",
        "allocate and free one buffer of each backing on this host and print what the kernel gave",
    ),
    "run": Command(
        "run", "run scenarios (the bundled library by default) and report PASS/FAIL for each"
    ),
    "inspect": Command(
        "inspect", "print the host model read from a dump (directory, tarball or bare meminfo)"
    ),
    "collect": Command(
        "collect",
        "dump this host's /proc and /sys (memory, hugepages, NUMA, limits) into a tarball",
    ),
    "replay": Command(
        "replay",
        "replay a request on a dumped host: what the user saw, why, and fixes verified in "
        "simulation",
    ),
    "preflight": Command(
        "preflight",
        "check a request against the live host (or --root DUMP) in simulation: exit 0/1/2",
    ),
    "profiles": Command(
        "profiles",
        "show the allocator profiles (umbp-sim, mori-624002c) and the decision points that differ",
    ),
    "build-allocator": Command(
        "build_allocator",
        "compile allocator sources against the interposer (-Wl,--wrap) for --allocator OUT",
    ),
    "compare": Command(
        "compare",
        "run two allocators (built-in profile, module or built .so) over the same runs; diff them",
    ),
    "exec": Command(
        "exec",
        "run any program (a test binary, pytest, a benchmark) with its OS calls on a simulated "
        "host",
    ),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # One line naming the flag, exit 64 (argparse's default is 2).
        self.exit(EX_USAGE, f"{self.prog}: error: {message}\n")


class _VersionAction(argparse.Action):
    """``--version``: argparse's, but the version is looked up only when asked for (the
    package metadata reader alone costs more than the rest of the start-up)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS,
                 help: str = "show program's version number and exit") -> None:  # fmt: skip
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        sys.stdout.write(f"umbp-sim {_version()}\n")  # stdout, as argparse's version action
        parser.exit()


def selected_command(argv: list[str]) -> str | None:
    """The command ``argv`` runs: its first word, if no option comes before it (``--help``,
    ``--version``: the top level answers those) and it names a command."""
    if not argv or argv[0].startswith("-"):
        return None
    return argv[0] if argv[0] in COMMANDS else None


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser for ``argv``: every command with its help line, and the options of the one
    ``argv`` runs (``argv=None``: of every command). Only that command's module is imported."""
    parser = _Parser(
        prog="umbp-sim",
        description="UMBP host-memory allocator simulator",
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    wanted = None if argv is None else selected_command(argv)
    for name, command in COMMANDS.items():
        p = sub.add_parser(name, help=command.help, description=command.help)
        if argv is None or name == wanted:
            module = importlib.import_module(f"umbp_sim.commands.{command.module}")
            module.add_arguments(p)
            p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        if "UMBP_SIM_EXEC" in os.environ or "UMBP_SIM_EXEC_EVIDENCE" in os.environ:
            from umbp_sim.exec_host.machine_dir import out_of_exec

            out_of_exec()  # under `umbp-sim exec`, or a stray variable
        argv = sys.argv[1:]
    args = build_parser(argv).parse_args(argv)
    try:
        rc = int(args._run(args))
        # Flush here, not at interpreter exit: a block-buffered stdout (a pipe, without
        # PYTHONUNBUFFERED) whose reader left would fail after main() with a traceback.
        sys.stdout.flush()
        return rc
    except UmbpSimError as e:
        # The tool's own errors name the file/line/flag; no traceback for bad input.
        from umbp_sim.vocabulary.printable import (
            printable,  # an error may quote a dump: never raw escapes
        )

        text = printable(str(e), keep="\n" if e.multiline else "")
        print(f"umbp-sim {args.command}: {text}", file=sys.stderr)
        return getattr(e, "exit_code", EX_DATAERR)
    except BrokenPipeError as e:
        if not stdout_reader_gone():  # another pipe (a worker's, a server's): not an answer
            return internal_error(args.command, e)
        # `umbp-sim inspect ... | head`: the reader left; stop quietly like other Unix tools.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EX_OK
    except KeyboardInterrupt:
        return EX_INTERRUPTED
    except Terminated as e:  # SIGTERM, SIGHUP: what it started is ended (the finally blocks)
        print(f"umbp-sim {args.command}: {e}", file=sys.stderr)
        return e.exit_code
    except Exception as e:  # a bug, not an answer: never exit 1 (preflight's "demoted")
        return internal_error(args.command, e)


def stdout_reader_gone() -> bool:
    """Whether stdout is a pipe (or socket) whose reader has left: poll says POLLERR/POLLHUP.
    A BrokenPipeError from any other pipe must not pass for `| head` (exit 0 is an answer)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (OSError, ValueError):
        return False


def internal_error(command: str, e: BaseException) -> int:
    """One line (the traceback too with UMBP_SIM_TRACEBACK=1), exit 70 (EX_SOFTWARE)."""
    import traceback

    if os.environ.get("UMBP_SIM_TRACEBACK"):
        traceback.print_exception(e)
    from umbp_sim.vocabulary.printable import printable

    text = printable(" ".join(str(e).split())[:300])
    print(
        f"umbp-sim {command}: internal error: {type(e).__name__}: {text} "
        "(a bug in umbp-sim; UMBP_SIM_TRACEBACK=1 shows where)",
        file=sys.stderr,
    )
    return EX_SOFTWARE


if __name__ == "__main__":
    sys.exit(main())
