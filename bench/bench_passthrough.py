"""Benchmark 1: what the Kernel seam costs on the real kernel.

4 KiB Anonymous alloc+free through HostMemAllocator on LinuxKernel against the same syscalls
issued directly in C++ (target <= 1.05), and through TracingKernel(FaultyKernel(LinuxKernel))
with no rule (target <= 1.10). Native code only (bench_passthrough.cpp, built here with g++
against csrc/): Python's own overhead is bench 2's subject, not this one's.

    python bench/bench_passthrough.py [--quick] [--json]
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, build_native, emit, figure, ratios  # noqa: E402

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    quick = "--quick" in argv
    iters, rounds = (3000, 5) if quick else (20000, 11)

    sources = sorted((ROOT / "csrc" / "kernel").glob("*.cpp")) + sorted(
        (ROOT / "csrc" / "allocator").glob("*.cpp")
    )
    wrappers = all(
        (ROOT / "csrc" / "kernel" / f).exists() for f in ("faulty_kernel.h", "tracing_kernel.h")
    )
    exe = build_native(
        HERE / "bench_passthrough.cpp",
        sources,
        defines=["UMBP_BENCH_WRAPPERS"] if wrappers else [],
    )
    out = subprocess.run([str(exe), str(iters), str(rounds)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{exe.name} exited {out.returncode}: {out.stderr.strip()}")
    ns: dict[str, list[float]] = json.loads(out.stdout)

    raw = ns["raw"]
    figs = [
        figure(
            "alloc+free 4 KiB / raw mmap+munmap (prefault=False)",
            ratios(ns["alloc"], raw),
            target="<= 1.05",
            note=f"raw {sorted(raw)[len(raw) // 2]:.0f} ns/pair",
        ),
        figure(
            "alloc+free 4 KiB / raw mmap+POPULATE_WRITE+munmap (prefault=True)",
            ratios(ns["alloc_pop"], ns["raw_pop"]),
            target="<= 1.05",
        ),
    ]
    figs.append(
        figure(
            "simulated alloc+free/s from C++ (4 KiB Anonymous, prefault, SimKernel)",
            [1e9 / x for x in ns["sim_pop"]],
            unit="1/s",
            higher_is_better=True,
            note="issue 8 benchmark 2, native side",
        )
    )
    if "wrapped" in ns:
        figs.append(
            figure(
                "Tracing(Faulty(Linux)) no rule / raw mmap+munmap",
                ratios(ns["wrapped"], raw),
                target="<= 1.10",
            )
        )
        figs.append(
            figure(
                "Tracing(Faulty(Linux)) no rule / bare LinuxKernel allocator",
                ratios(ns["wrapped"], ns["alloc"]),
                target="<= 1.05",
                note="issue 4: wrappers add under 5%",
            )
        )
    else:
        figs.append(
            figure(
                "Tracing(Faulty(Linux)) no rule / raw mmap+munmap",
                None,
                target="<= 1.10",
                note="not available yet: csrc/kernel has no faulty_kernel.h/tracing_kernel.h",
            )
        )
    return {
        "bench": "passthrough",
        "figures": figs,
        "raw": {"ns_per_pair": ns, "iterations": iters, "rounds": rounds},
    }


if __name__ == "__main__":
    emit(main(), sys.argv[1:])
