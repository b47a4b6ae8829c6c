"""Benchmark: `umbp-sim --help` starts like a small script (issue 17, item 5).

Wall time of fresh processes, as ratios to `python -c pass` (the interpreter's own start-up)
measured side by side: in each round every variant runs `REPEAT` times, interleaved, and its
fastest run counts (start-up noise is one-sided). Variants:

- `umbp-sim --help` (the console script): argparse and `umbp_sim.cli` only;
- `umbp-sim replay --help`: one command's parser (the request's flags, no simulator);
- the eager parser, for reference: every command's module and parser plus the compiled
  extension, as `umbp-sim --help` cost before (`cli.build_parser()` with no argv builds them
  all; `umbp_sim._native` imported beside it).

    python bench/bench_cli_startup.py [--quick] [--json]

Runs from a temporary directory (not the repository root, whose `umbp_sim/` has no extension).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, figure, ratios, timed_run  # noqa: E402

REPEAT = 3
EAGER = "import umbp_sim._native, umbp_sim.cli as c; c.build_parser()"


def _console_script() -> list[str]:
    """`umbp-sim` beside this interpreter (a venv's bin/), else the module."""
    script = Path(sys.executable).with_name("umbp-sim")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "umbp_sim.cli"]


def variants() -> dict[str, list[str]]:
    umbp = _console_script()
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        "umbp-sim --help": [*umbp, "--help"],
        "umbp-sim replay --help": [*umbp, "replay", "--help"],
        "eager parser": [sys.executable, "-c", EAGER],
    }


# Modules a command's --help loads (tests/test_cli_imports.py bounds the umbp_sim ones).
COUNT = """
import contextlib, io, sys
from umbp_sim.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main(sys.argv[1:])
    except SystemExit:
        pass
print(sum(m.startswith("umbp_sim") for m in sys.modules), len(sys.modules))
"""
HELP_COMMANDS = ("replay", "preflight", "inspect")


def modules_loaded(argv: list[str], cwd: str) -> tuple[int, int]:
    """(umbp_sim modules, all modules) in sys.modules after ``umbp-sim ARGV``."""
    out = subprocess.run(
        [sys.executable, "-c", COUNT, *argv], cwd=cwd, capture_output=True, text=True, check=True
    ).stdout.split()
    return int(out[0]), int(out[1])


def _wall(cmd: list[str], cwd: str) -> float:
    return timed_run(cmd, cwd)[0]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    rounds = 2 if "--quick" in argv else 12
    cmds = variants()
    times: dict[str, list[float]] = {name: [] for name in cmds}
    env_cwd = tempfile.mkdtemp(prefix="umbp-bench-cli-")
    try:
        loaded = {c: modules_loaded([c, "--help"], env_cwd) for c in HELP_COMMANDS}
        for cmd in cmds.values():  # warm the page cache
            _wall(cmd, env_cwd)
        for _ in range(rounds):
            best = {name: float("inf") for name in cmds}
            for _ in range(REPEAT):
                for name, cmd in cmds.items():
                    best[name] = min(best[name], _wall(cmd, env_cwd))
            for name in cmds:
                times[name].append(best[name])
    finally:
        os.rmdir(env_cwd)
    base = times["python -c pass"]
    ms = {name: 1000 * sorted(t)[len(t) // 2] for name, t in times.items()}
    note = ", ".join(f"{name} {v:.0f} ms" for name, v in ms.items())
    return {
        "bench": "cli_startup",
        "seconds": times,
        "modules": {f"{c} --help": {"umbp_sim": u, "all": a} for c, (u, a) in loaded.items()},
        "figures": [
            figure(
                "umbp-sim --help / python -c pass (wall)",
                ratios(times["umbp-sim --help"], base),
                target="<= 3",
                note=note,
            ),
            figure(
                "umbp-sim replay --help / python -c pass (wall)",
                ratios(times["umbp-sim replay --help"], base),
                note="modules loaded by --help: "
                + ", ".join(f"{c} {u} umbp_sim / {a} in all" for c, (u, a) in loaded.items()),
            ),
            figure(
                "eager parser (every command + extension) / python -c pass (wall)",
                ratios(times["eager parser"], base),
                note="what --help cost before issue 17 item 5, for reference",
            ),
        ],
    }


if __name__ == "__main__":
    emit(main(), sys.argv[1:])
