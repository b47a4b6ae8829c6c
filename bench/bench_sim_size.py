"""Simulated size costs nothing: alloc (mmap + MADV_POPULATE_WRITE + munmap through raw
SimKernel calls) of 4 KiB versus 4 TiB on a 4 TiB simulated host, and the RSS the simulation
adds. Prints a table and a JSON line. Run: python bench/bench_sim_size.py [--repeat N]

The model's own cost does not depend on the size (counters and interval runs). What does is the
real address space behind every mapping: the host kernel's munmap of a >= 1 GiB range costs
about 6 us more than of a 4 KiB one (measured with plain mmap/munmap), which is most of the gap.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from umbp_sim import _native
from umbp_sim.machine import GiB, KiB, Machine, MiB, TiB
from umbp_sim.sim import build_kernel

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=300)
    args = ap.parse_args()

    rss0 = rss_bytes()
    k1g = build_kernel(host({"1GiB": 4096}))
    k2m = build_kernel(host({"2MiB": 2 * 1024 * 1024}))
    kanon = build_kernel(host({}))
    cases = [
        ("4 KiB anonymous", kanon, 4 * KiB, PRIV),
        ("4 TiB anonymous (4 KiB pages)", kanon, 4 * TiB, PRIV),
        ("4 KiB hugetlb 2 MiB", k2m, 4 * KiB, HUGE | (21 << C["MAP_HUGE_SHIFT"])),
        ("4 TiB hugetlb 2 MiB", k2m, 4 * TiB, HUGE | (21 << C["MAP_HUGE_SHIFT"])),
        ("4 KiB hugetlb 1 GiB", k1g, 4 * KiB, HUGE | (30 << C["MAP_HUGE_SHIFT"])),
        ("4 TiB hugetlb 1 GiB", k1g, 4 * TiB, HUGE | (30 << C["MAP_HUGE_SHIFT"])),
    ]
    rows = []
    for name, k, length, flags in cases:
        rows.append((name, length, median_seconds(k, length, flags, args.repeat)))
    rss1 = rss_bytes()

    base = rows[0][2]
    print(f"{'case':32} {'bytes':>16} {'median us':>10} {'x 4KiB':>8}")
    for name, length, t in rows:
        print(f"{name:32} {length:16d} {t * 1e6:10.2f} {t / base:8.2f}")
    ratio_1g = rows[5][2] / rows[4][2]
    ratio_2m = rows[3][2] / rows[2][2]
    ratio_anon = rows[1][2] / rows[0][2]
    growth = rss1 - rss0
    print(
        f"4 TiB / 4 KiB: hugetlb-1G {ratio_1g:.2f}x, hugetlb-2M {ratio_2m:.2f}x, "
        f"anonymous {ratio_anon:.2f}x; RSS growth {growth / MiB:.2f} MiB"
    )
    print(
        json.dumps(
            {
                "repeat": args.repeat,
                "median_us": {name: round(t * 1e6, 3) for name, _, t in rows},
                "ratio_4tib_over_4kib": {
                    "hugetlb_1g": round(ratio_1g, 3),
                    "hugetlb_2m": round(ratio_2m, 3),
                    "anonymous": round(ratio_anon, 3),
                },
                "rss_growth_bytes": growth,
            }
        )
    )


if __name__ == "__main__":
    main()
