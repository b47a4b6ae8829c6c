"""Benchmark 5: the bundled scenario library's throughput (scenarios per second).

Three ways, each repeated: ``umbp-sim run`` pinned to one core (a fresh process, so torch's
import, which the sglang scenarios need, is paid once as a user pays it), the library run
in-process after warm-up (the cost of the scenarios themselves), and ``pytest -n 2`` over
``scenarios/``. Target (issue 5): the whole library in under 10 s on one core.

    python bench/bench_scenarios.py [--quick] [--json]
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, emit, figure, rate, timed_run, unavailable  # noqa: E402


def _timed(cmd: list[str]) -> float:
    return timed_run(cmd)[0]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    rounds = 2 if "--quick" in argv else 5
    from umbp_sim.scenario.scenario_run import run_scenario
    from umbp_sim.scenario.schema import find_scenarios, load_scenario

    files = find_scenarios([ROOT / "scenarios"])
    n = len(files)
    one_core = ["taskset", "-c", "0", sys.executable, "-m", "umbp_sim.cli", "run"]
    cli = [_timed(one_core) for _ in range(rounds)]
    for p in files:  # warm-up: imports (torch) and first-use costs
        run_scenario(load_scenario(p, root=ROOT / "scenarios"))
    inproc = []
    for _ in range(rounds):
        t = time.perf_counter()
        for p in files:
            run_scenario(load_scenario(p, root=ROOT / "scenarios"))
        inproc.append(time.perf_counter() - t)
    what = "scenarios/s, pytest -n 2 (incl. start-up)"
    if importlib.util.find_spec("xdist") is None:
        parallel = unavailable(what, "needs pytest-xdist: pip install '.[test]'", unit="1/s")
    else:
        xdist = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "scenarios"]
        parallel = rate(
            what, n, [_timed([sys.executable, *xdist]) for _ in range(max(1, rounds // 2))]
        )
    return {
        "bench": "scenarios",
        "scenarios": n,
        "figures": [
            figure(f"umbp-sim run, {n} scenarios, one core (s)", cli, unit="s", target="< 10"),
            rate("scenarios/s, umbp-sim run, one core", n, cli),
            rate("scenarios/s, in-process after warm-up", n, inproc),
            parallel,
        ],  # fmt: skip
    }


if __name__ == "__main__":
    emit(main(), sys.argv[1:])
