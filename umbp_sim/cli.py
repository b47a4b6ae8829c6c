"""Command line: ``umbp-sim COMMAND ...``.

Each command lives in ``umbp_sim/commands/<name>.py`` and exposes ``HELP`` (one line),
``add_arguments(parser)`` and ``run(args) -> int``. Commands are imported only when used, so
``umbp-sim --help`` stays fast and a command's heavy imports (torch) cost nothing elsewhere.

Exit codes follow sysexits: 0 success, 1 a negative answer (a scenario failed, a request will be
demoted), 64 bad usage, 65 bad input data.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from umbp_sim.errors import UmbpSimError

EX_USAGE = 64
EX_DATAERR = 65

# name -> module under umbp_sim.commands
COMMANDS: dict[str, str] = {
    "probe": "probe",
    "run": "run",
    "inspect": "inspect",
    "collect": "collect",
    "replay": "replay",
    "preflight": "preflight",
    "build-allocator": "build_allocator",
    "compare": "compare",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # One line naming the flag, exit 64 (argparse's default is 2).
        self.exit(EX_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="umbp-sim", description="UMBP host-memory allocator simulator")
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


if __name__ == "__main__":
    sys.exit(main())
