"""Cost of fault injection and tracing, as ratios (not a timed test).

(a) A 4 KiB Anonymous alloc+free loop through the allocator (mmap, MADV_POPULATE_WRITE, munmap)
    on a bare LinuxKernel, against the same loop on TracingKernel(FaultyKernel(LinuxKernel))
    with no rule for any call the loop makes. Target: under 5% overhead.
(b) The same loop with ENOMEM injected into every 10th mmap, in-process by a FaultPlan, against
    the same loop on a bare LinuxKernel in a child process under
    ``strace -f -e inject=mmap:error=ENOMEM:when=10+10`` (attached after the child's imports, so
    the dynamic loader's mmaps are not hit). Target: strace more than 50x slower.
(c) For scale, the cost of one injected call alone: raw mmap calls that all fail with ENOMEM,
    by a FaultyKernel vs. by strace (``inject=mmap:error=ENOMEM``, every call).

Usage: python bench/bench_faults.py [--iterations N] [--strace-iterations N] [--repeats N]
Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from umbp_sim import _native
from umbp_sim.allocator import Anonymous, UMBPHostMemAllocator
from umbp_sim.faults import FaultPlan, FaultRule
from umbp_sim.host.trace import instrument

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, figure  # noqa: E402

# The injected ENOMEMs make the allocator warn on every failed call; the cost of printing them
# is not what is measured.
logging.getLogger("umbp_sim.allocator").addHandler(logging.NullHandler())
logging.getLogger("umbp_sim.allocator").propagate = False


def loop(alloc: UMBPHostMemAllocator, n: int) -> tuple[float, int]:
    """Seconds for n alloc+free of 4 KiB, and how many allocs failed."""
    failed = 0
    t0 = time.perf_counter()
    for _ in range(n):
        h = alloc.alloc(4096, Anonymous)
        if h:
            alloc.free(h)
        else:
            failed += 1
    return time.perf_counter() - t0, failed


def bench_overhead(n: int, repeats: int) -> dict[str, float]:
    bare = UMBPHostMemAllocator(_native.LinuxKernel())
    st = instrument(_native.LinuxKernel(), FaultPlan(), limit=1000)
    wrapped = UMBPHostMemAllocator(st.kernel)
    loop(bare, n // 10)  # warm up
    loop(wrapped, n // 10)
    bare_t, wrapped_t = [], []
    # Short interleaved rounds, best of each: the machine is shared, and interference only
    # ever adds time, so the minimum is the estimate least disturbed by it.
    rounds = repeats * 4
    for _ in range(rounds):
        bare_t.append(loop(bare, n // 4)[0])
        wrapped_t.append(loop(wrapped, n // 4)[0])
    b, w = min(bare_t) * 4, min(wrapped_t) * 4
    return {
        "iterations": n,
        "bare_us_per_iter": b / n * 1e6,
        "wrapped_us_per_iter": w / n * 1e6,
        "overhead_pct": (w / b - 1) * 100,
        "median_overhead_pct": (statistics.median(wrapped_t) / statistics.median(bare_t) - 1) * 100,
        "trace_records_seen": st.tracing.calls,
    }


def bench_inprocess_enomem(n: int, repeats: int) -> dict[str, float]:
    plan = FaultPlan((FaultRule(op="mmap", errno="ENOMEM", every=10),))
    times = []
    failed = 0
    for _ in range(repeats):
        alloc = UMBPHostMemAllocator(plan.wrap(_native.LinuxKernel()))
        t, failed = loop(alloc, n)
        times.append(t)
    return {"iterations": n, "us_per_iter": min(times) / n * 1e6, "failed": failed}


def raw_mmap_loop(kernel: object, n: int) -> tuple[float, int]:
    """Seconds for n raw 4 KiB mmap calls (each unmapped if it succeeds), and failures."""
    failed = 0
    t0 = time.perf_counter()
    for _ in range(n):
        r = kernel.mmap(0, 4096, 3, 0x22)  # type: ignore[attr-defined]
        if r.ok:
            kernel.munmap(r.value, 4096)  # type: ignore[attr-defined]
        else:
            failed += 1
    return time.perf_counter() - t0, failed


def child_main(mode: str, n: int) -> None:
    """Run by the strace benchmarks: wait for the tracer, run the loop, print the timing."""
    if mode == "alloc":
        alloc = UMBPHostMemAllocator(_native.LinuxKernel())
        run = lambda: loop(alloc, n)  # noqa: E731
    else:
        kernel = _native.LinuxKernel()
        run = lambda: raw_mmap_loop(kernel, n)  # noqa: E731
    print("ready", flush=True)
    sys.stdin.readline()
    t, failed = run()
    print(json.dumps({"seconds": t, "failed": failed}), flush=True)


def bench_inprocess_raw(n: int, repeats: int) -> dict[str, float]:
    fk = FaultPlan((FaultRule(op="mmap", errno="ENOMEM"),)).wrap(_native.LinuxKernel())
    times, failed = [], 0
    for _ in range(repeats):
        t, failed = raw_mmap_loop(fk, n)
        times.append(t)
    return {"iterations": n, "us_per_iter": min(times) / n * 1e6, "failed": failed}


def bench_strace(n: int, mode: str = "alloc", when: str = ":when=10+10", runs: int = 3) -> dict:
    """Best of `runs` child processes under strace."""
    results = [strace_once(n, mode, when) for _ in range(runs)]
    return min(results, key=lambda r: r["us_per_iter"])


def strace_once(n: int, mode: str, when: str) -> dict[str, float]:
    strace = shutil.which("strace")
    if strace is None:
        raise SystemExit("bench_faults: strace is not installed (apt-get install strace)")
    child = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--child", mode, str(n)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        if child.stdout.readline().strip() != "ready":
            raise SystemExit("bench_faults: child did not start")
        tracer = subprocess.Popen(
            [
                strace,
                "-f",
                "-qq",
                "-o",
                "/dev/null",
                "-e",
                "inject=mmap:error=ENOMEM" + when,
                "-p",
                str(child.pid),
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        # strace has no "attached" signal with -qq; give it time to seize every thread.
        time.sleep(1.0)
        child.stdin.write("go\n")
        child.stdin.flush()
        result = json.loads(child.stdout.readline())
        child.wait(timeout=600)
        tracer.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    return {
        "iterations": n,
        "us_per_iter": result["seconds"] / n * 1e6,
        "failed": result["failed"],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=50000)
    p.add_argument("--strace-iterations", type=int, default=5000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="short runs: check it works")
    p.add_argument("--json", action="store_true")
    p.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if args.child is not None:
        child_main(args.child[0], int(args.child[1]))
        raise SystemExit(0)
    if args.quick:
        args.iterations, args.strace_iterations, args.repeats = 5000, 500, 2

    a = bench_overhead(args.iterations, args.repeats)
    b_in = bench_inprocess_enomem(args.iterations, args.repeats)
    b_st = bench_strace(args.strace_iterations)
    ratio = b_st["us_per_iter"] / b_in["us_per_iter"]
    c_in = bench_inprocess_raw(args.iterations, args.repeats)
    c_st = bench_strace(args.strace_iterations, mode="raw", when="")
    ratio_c = c_st["us_per_iter"] / c_in["us_per_iter"]
    us = "us/iter"
    return {
        "bench": "faults",
        "overhead": a,
        "enomem_inprocess": b_in,
        "enomem_strace": b_st,
        "injected_call_inprocess": c_in,
        "injected_call_strace": c_st,
        "figures": [
            figure(
                "Tracing(Faulty(Linux)) no rule: overhead on 4 KiB alloc+free, best-of",
                [a["overhead_pct"]],
                unit="%",
                target="< 5",
                note=f"{a['bare_us_per_iter']:.2f} vs {a['wrapped_us_per_iter']:.2f} {us}",
            ),
            figure(
                "strace inject / in-process, ENOMEM every 10th mmap, alloc+free loop",
                [ratio],
                target="> 50",
                higher_is_better=True,
                note=f"{b_st['us_per_iter']:.1f} vs {b_in['us_per_iter']:.2f} {us}",
            ),
            figure(
                "strace inject / in-process, per injected mmap (no real syscall)",
                [ratio_c],
                higher_is_better=True,
                note=f"{c_st['us_per_iter']:.1f} vs {c_in['us_per_iter']:.2f} {us}",
            ),
        ],  # fmt: skip
    }


if __name__ == "__main__":
    emit(main(), [a for a in sys.argv[1:] if a == "--json"])
