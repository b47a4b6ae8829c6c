"""Simulated size costs nothing: alloc (mmap + MADV_POPULATE_WRITE + munmap through raw
SimKernel calls) of 4 KiB versus 4 TiB on a 4 TiB simulated host, and the RSS the simulation
adds. Prints a table and a JSON line. Run: python bench/bench_sim_size.py [--repeat N]

The model's own cost does not depend on the size (counters and interval runs). What does is the
real address space behind every mapping: the host kernel's munmap of a >= 1 GiB range costs
about 6 us more than of a 4 KiB one (measured with plain mmap/munmap), which is most of the gap.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

from umbp_sim import _native
from umbp_sim.machine import GiB, KiB, Machine, MiB, TiB
from umbp_sim.sim import build_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, figure  # noqa: E402

C = _native.constants
RW = C["PROT_READ"] | C["PROT_WRITE"]
PRIV = C["MAP_PRIVATE"] | C["MAP_ANONYMOUS"]
HUGE = PRIV | C["MAP_HUGETLB"]
PW = C["MADV_POPULATE_WRITE"]


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def host(pool: dict[str, int]) -> Machine:
    # 4 TiB of memory on 4 nodes, plus room for the kernel, with the given hugepage pool.
    return Machine.x86_64(nodes=4, mem_per_node=TiB + 4 * GiB, hugepages=pool, overcommit_memory=1)


def one_alloc(k, length: int, flags: int) -> None:  # type: ignore[no-untyped-def]
    # A hugetlb mapping is rounded up to whole hugepages; munmap must name all of it.
    unit = 1 << ((flags >> C["MAP_HUGE_SHIFT"]) & 0x3F) if flags & C["MAP_HUGETLB"] else 4096
    length = (length + unit - 1) // unit * unit
    r = k.mmap(0, length, RW, flags)
    assert r.ok, r
    p = k.madvise(r.value, length, PW)
    assert p.ok, p
    u = k.munmap(r.value, length)
    assert u.ok, u


def median_seconds(k, length: int, flags: int, repeat: int) -> float:  # type: ignore[no-untyped-def]
    one_alloc(k, length, flags)  # warm up
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        one_alloc(k, length, flags)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    repeat = 60 if "--quick" in argv else 300
    rss0 = rss_bytes()
    k1g = build_kernel(host({"1GiB": 4096}))
    k2m = build_kernel(host({"2MiB": 2 * 1024 * 1024}))
    kanon = build_kernel(host({}))
    cases = [
        ("anonymous (4 KiB pages)", kanon, PRIV),
        ("hugetlb 2 MiB", k2m, HUGE | (21 << C["MAP_HUGE_SHIFT"])),
        ("hugetlb 1 GiB", k1g, HUGE | (30 << C["MAP_HUGE_SHIFT"])),
    ]
    figures, medians = [], {}
    for name, k, flags in cases:
        small = median_seconds(k, 4 * KiB, flags, repeat)
        big = median_seconds(k, 4 * TiB, flags, repeat)
        medians[name] = {"4KiB_us": small * 1e6, "4TiB_us": big * 1e6}
        figures.append(
            figure(f"4 TiB / 4 KiB simulated mmap+populate+munmap, {name}", [big / small],
                   target="<= 2", note=f"{small * 1e6:.1f} vs {big * 1e6:.1f} us")
        )  # fmt: skip
    growth = rss_bytes() - rss0
    figures.append(
        figure("RSS growth for 4 TiB simulated hosts", [growth / MiB], unit="MiB", target="< 16")
    )
    return {"bench": "sim_size", "repeat": repeat, "median_us": medians, "figures": figures}


if __name__ == "__main__":
    emit(main(), sys.argv[1:])
