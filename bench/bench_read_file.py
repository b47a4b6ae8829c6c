"""Benchmark: SimKernel.read_file of one /proc file against a trivial kernel call, side by side.

read_file renders only the file asked for (its group: /proc/meminfo, /proc/zoneinfo,
/proc/sys, /sys/kernel/mm/hugepages, or one node's directory under /sys/devices/system/node),
not the whole tree. Measured from Python on an 8-node host with 2 MiB and 1 GiB pools, so the
per-call binding cost is in both columns:

  - read_file("/proc/meminfo") calls per second,
  - read_file("/sys/devices/system/node/node7/meminfo") calls per second (one node's directory),
  - page_size() calls per second (a kernel call that renders nothing),
  - render_all() calls per second: every file, the work each read_file did before (plus the
    conversion of the map to a dict, so it overstates the old cost slightly),
  - and their per-round ratios (time of a read / time of page_size or of render_all).

A true before/after ratio cannot be taken in one run (the old code is gone); the ratio against
the trivial call is what stays comparable between runs. Needs an installed umbp-sim.

    python bench/bench_read_file.py [--quick] [--json]
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, figure, ratios  # noqa: E402

NODE_MEMINFO = "/sys/devices/system/node/node7/meminfo"


def rate(call: Callable[[], Any], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    return n / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    quick = "--quick" in (sys.argv[1:] if argv is None else argv)
    n, rounds = (300, 3) if quick else (3000, 9)
    # Needs an installed umbp-sim: without one this raises and run_all shows an error row.
    from umbp_sim.machine import Machine
    from umbp_sim.sim import SimHost

    host = SimHost(Machine.x86_64(nodes=8, hugepages={"2MiB": 4096, "1GiB": 8}))
    k = host.kernel
    for path in ("/proc/meminfo", NODE_MEMINFO):  # the paths exist and read as rendered
        assert k.read_file(path) == k.render_all()[path], f"read_file({path}) differs"
    # (call, calls per round): each case runs for a similar time per round
    cases: dict[str, tuple[Callable[[], Any], int]] = {
        "read_file(/proc/meminfo)": (lambda: k.read_file("/proc/meminfo"), n),
        "read_file(node7/meminfo)": (lambda: k.read_file(NODE_MEMINFO), n),
        "page_size()": (k.page_size, n * 100),
        "render_all()": (k.render_all, max(n // 10, 30)),
    }
    rates: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, (call, calls) in cases.items():
            rates[name].append(rate(call, calls))
    figs = [figure(f"{name} calls/s (Python, 8 nodes)", rates[name], "1/s") for name in cases]
    base = rates["page_size()"]
    every = rates["render_all()"]
    for name in ("read_file(/proc/meminfo)", "read_file(node7/meminfo)"):
        # time per read / time per page_size() == page_size rate / read rate
        figs.append(figure(f"{name} / page_size() time", ratios(base, rates[name])))
        figs.append(figure(f"{name} / render_all() time", ratios(every, rates[name])))
    return {"bench": "read_file", "figures": figs}


if __name__ == "__main__":
    emit(main(), sys.argv[1:])
