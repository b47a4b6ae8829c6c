"""Benchmark: one external run, and the full matrix on an external build (issue 27, item 6).

The test allocator (tests/external/tiny_allocator.cpp, built as bench_compare builds it) in
its server, one forked process per run:

- the time of one run as compare's worker sees it (``ExternalRunner.observe``: fork, the run,
  the reply), over the quick matrix's runs; the median of all (target <= 3 ms), and of the
  runs with numa_node 2^31-1 alone (the allocator zeroes a 256 MiB nodemask in real memory);
- the same runs with each run's process forked when its run arrives (``fork_ahead=False``)
  against the default (forked and warmed up while the run before runs), in interleaved rounds:
  the ratio of their medians;
- those nodemask runs with the server's malloc on transparent hugepages (the default,
  ``runner.MALLOC_THP``) against 4 KiB pages (``GLIBC_TUNABLES=glibc.malloc.hugetlb=0``), side
  by side in interleaved rounds: the ratio of their medians;
- ``umbp-sim compare umbp-sim TINY --matrix full --no-scenarios --shard 1/N --jobs 2``, the
  whole command, for a prime N and for a shard of two runs (the start-up): the difference is
  the runs' cost, the full matrix (184,320 runs) in minutes on this machine's cores (target
  <= 15 on 2 cores), start-up once. Shards take every N-th run; a prime N holds the matrix's
  mix (a power of two would keep one kernel and one fault plan).

    python bench/bench_external_run.py [--quick] [--json]
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, figure, ratios, unavailable  # noqa: E402
from bench_compare import build_tiny, compare_command  # noqa: E402

NODEMASK = "numa_node=2147483647"
FULL_RUNS = 184_320


def _observe_times(
    so: Path, env: dict[str, str], runs: list[Any], fork_ahead: bool = True
) -> list[float]:
    from umbp_sim.allocator_spec import parse_allocator_spec
    from umbp_sim.external.runner import ExternalRunner

    runner = ExternalRunner(parse_allocator_spec(str(so)), env=env, fork_ahead=fork_ahead)
    try:
        runner.observe(runs[0])  # warm-up: the server's first fork
        times = []
        for run in runs:
            t = time.perf_counter()
            runner.observe(run)  # a crash is a reply too: what is timed is the round trip
            times.append(time.perf_counter() - t)
        return times
    finally:
        runner.close()


def _full_matrix_minutes(so: Path, shards: int) -> float:
    """One shard (1/N) and the command with a run or two (its start-up): the difference is the
    runs' cost, the full matrix's added to the start-up once. N is a prime: a shard takes every
    N-th run, and the matrix's dimensions multiply to 2^12 x 3^2 x 5, so a stride with a common
    factor (64, 128) keeps the same kernel and fault plan in every run it takes (a bias of 2x
    either way, seen), where a prime stride takes every combination alike. The runs' costs have
    a long tail (a 1 TiB buffer touched by hand until the OOM kill: up to 0.9 s; a 256 MiB
    nodemask zeroed: 40 ms), so a shard's figure swings with the few it holds."""
    big_t, big_n = compare_command("umbp-sim", str(so), 2, "--shard", f"1/{shards}")
    small_t, small_n = compare_command("umbp-sim", str(so), 2, "--shard", f"1/{FULL_RUNS // 2}")
    per_run = (big_t - small_t) / (big_n - small_n)
    startup = max(0.0, small_t - small_n * per_run)
    return (startup + FULL_RUNS * per_run) / 60


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    quick = "--quick" in argv
    if importlib.util.find_spec("pybind11") is None:
        why = "needs pybind11 to build the test allocator: pip install '.[test]'"
        return {"bench": "external_run", "figures": [unavailable("external run", why, "<= 3")]}
    from umbp_sim.comparison.matrix import quick as quick_matrix

    so = build_tiny()
    runs = list(quick_matrix())
    nodemask = [r for r in runs if NODEMASK in r.label]
    if quick:
        runs, nodemask = runs[::8], nodemask[:2]
    rounds = 1 if quick else 3
    every: list[float] = []
    ahead: list[float] = []  # each round's median, forked ahead / on arrival
    arrival: list[float] = []
    thp: list[float] = []
    small: list[float] = []
    for _ in range(rounds):
        times = _observe_times(so, {}, runs)
        every += times
        ahead.append(statistics.median(times))
        arrival.append(statistics.median(_observe_times(so, {}, runs, fork_ahead=False)))
        thp.append(statistics.median(_observe_times(so, {}, nodemask)))
        small.append(
            statistics.median(
                _observe_times(so, {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, nodemask)
            )
        )
    ms = [t * 1e3 for t in every]
    masked = [t * 1e3 for t in thp]
    shards = 509 if quick else 61
    minutes = [_full_matrix_minutes(so, shards) for _ in range(1 if quick else 2)]
    figures = [
        figure("one external run, quick matrix (ms)", ms, unit="ms", target="<= 3",
               note=f"{len(runs)} runs x {rounds}; fork, run, reply"),
        figure("one external run: forked on arrival / forked ahead", ratios(arrival, ahead),
               note="median of each round, the same runs; the server's baseline without a spare"),
        figure("one external run with numa_node 2^31-1 (ms)", masked, unit="ms",
               note="median of each round; a 256 MiB nodemask zeroed"),
        figure("numa_node 2^31-1 run: 4 KiB malloc pages / THP malloc", ratios(small, thp),
               note="GLIBC_TUNABLES=glibc.malloc.hugetlb=0 vs the server's default"),
        figure(f"full matrix on an external build, {os.cpu_count()} cores (min)", minutes,
               unit="min", target="<= 15",
               note=f"compare --jobs 2 over --shard 1/{shards}, per run; start-up once"),
    ]  # fmt: skip
    return {"bench": "external_run", "figures": figures, "raw": {"run_ms": ms}}


if __name__ == "__main__":
    emit(main(), sys.argv)
