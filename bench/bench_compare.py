"""Benchmark: ``umbp-sim compare`` throughput, ``--jobs 1`` vs ``--jobs 2`` (issue 14, item 5).

The whole command in a fresh process (start-up, the allocator servers, the runs, the report),
timed side by side in interleaved rounds, over a fixed slice of the full request matrix:

- the built-in allocator against the test allocator (tests/external/tiny_allocator.cpp, built
  here with ``umbp-sim build-allocator``: link-time mode), a forked process per external run;
- the two built-in profiles (``umbp-sim`` vs ``mori``), every run in process.

Figures: runs per second for each, and the speed-up of ``--jobs 2`` (``--jobs 1`` time /
``--jobs 2`` time; 2 is the most two cores can give, and the machine is shared).

    python bench/bench_compare.py [--quick] [--json]
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import BUILD, ROOT, emit, figure, ratios, unavailable  # noqa: E402

TINY = ROOT / "tests" / "external" / "tiny_allocator.cpp"
# 960 runs of the full matrix: every backing, size, hugepage size and node, prefault on, the
# field's pool state, kernel 6.8, no fault; the built-in pair gets every pool and prefault.
EXTERNAL_SLICE = "[[]pool-on-node0 k6.8.0] *prefault=True)"
BUILTIN_SLICE = "[[]* k6.8.0] *"  # 5,760 runs


def build_tiny() -> Path:
    h = hashlib.sha256(TINY.read_bytes()).hexdigest()[:12]
    out = BUILD / f"tiny_wrapped_{h}.so"  # the module name is the file name's stem
    if not out.exists():
        BUILD.mkdir(parents=True, exist_ok=True)
        print(f"bench: building {out.name} ...", file=sys.stderr, flush=True)
        proc = subprocess.run(
            [sys.executable, "-P", "-m", "umbp_sim.cli", "build-allocator", str(TINY),
             "-D", f"TINY_MODULE_NAME={out.name.split('.')[0]}",
             "-o", str(out)],
            capture_output=True, text=True,
        )  # fmt: skip
        if proc.returncode != 0:
            first = (proc.stderr.strip().splitlines() or ["no output"])[0]
            raise RuntimeError(f"building the test allocator failed: {first}")
    return out


def compare_command(a: str, b: str, jobs: int, *select: str) -> tuple[float, int]:
    """(wall seconds, runs) of one ``compare A B --matrix full --no-scenarios`` command over
    the runs ``select`` picks (``-k PATTERN``, ``--shard K/N``), bounded to an hour."""
    cmd = [sys.executable, "-P", "-m", "umbp_sim.cli", "compare", a, b, "--matrix", "full"]
    cmd += ["--no-scenarios", *select, "--jobs", str(jobs), "--json"]
    env = dict(os.environ, UMBP_SIM_PROGRESS="0")
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    wall = time.perf_counter() - t
    if out.returncode not in (0, 1):
        raise RuntimeError(f"compare exited {out.returncode}: {out.stderr.strip()[-2000:]}")
    return wall, int(json.loads(out.stdout)["runs"])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    quick = "--quick" in argv
    rounds = 1 if quick else 3
    if importlib.util.find_spec("pybind11") is None:  # the test allocator is a pybind11 module
        why = "needs pybind11 to build the test allocator: pip install '.[test]'"
        return {"bench": "compare", "figures": [unavailable("compare runs/s", why, unit="1/s")]}
    tiny = str(build_tiny())
    pairs = {
        "umbp-sim vs test allocator (external)": ("umbp-sim", tiny, EXTERNAL_SLICE),
        "umbp-sim vs mori (built-in profiles)": ("umbp-sim", "mori", BUILTIN_SLICE),
    }
    if quick:  # 120 and 720 runs
        pairs = {k: (a, b, p.replace("] *", "] alloc(size=4096, *")) for k, (a, b, p) in
                 pairs.items()}  # fmt: skip
    figures = []
    raw: dict[str, Any] = {}
    for what, (a, b, pattern) in pairs.items():
        times: dict[int, list[float]] = {1: [], 2: []}
        runs = 0
        for _ in range(rounds):
            for jobs in (1, 2):
                wall, runs = compare_command(a, b, jobs, "-k", pattern)
                times[jobs].append(wall)
        raw[what] = {"runs": runs, "wall": times}
        for jobs in (1, 2):
            figures.append(
                figure(f"compare {what}, --jobs {jobs}: runs/s", [runs / t for t in times[jobs]],
                       unit="1/s", note=f"{runs} runs, whole command")
            )  # fmt: skip
        figures.append(
            figure(f"compare {what}: --jobs 1 time / --jobs 2 time", ratios(times[1], times[2]),
                   target=">= 1.5", note="2 cores, shared")
        )  # fmt: skip
    return {"bench": "compare", "figures": figures, "raw": raw}


if __name__ == "__main__":
    emit(main(), sys.argv)
