"""Writes the hand-made dumps of this directory (run from anywhere; idempotent).

Each dump is NAME/{proc,sys}/... in the fixtures' layout, holding only what replay needs:
meminfo, osrelease, the hugepage sysfs files, the node lists and node meminfo/hugepages.
The two "Not enough host memory" meminfo figures are tests/test_sglang_sizing.py's.
"""

from __future__ import annotations

import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
GiB_KB = 1 << 20  # kB per GiB


def meminfo(fields: dict[str, int]) -> str:
    return "".join(
        f"{k + ':':<16}{v:>8}{'' if k.startswith('HugePages_') else ' kB'}\n"
        for k, v in fields.items()
    )


def node_meminfo(n: int, total_kb: int, free_kb: int, hp: tuple[int, int]) -> str:
    return (
        f"Node {n} MemTotal:       {total_kb:>8} kB\n"
        f"Node {n} MemFree:        {free_kb:>8} kB\n"
        f"Node {n} MemUsed:        {total_kb - free_kb:>8} kB\n"
        f"Node {n} HugePages_Total: {hp[0]:>5}\n"
        f"Node {n} HugePages_Free:  {hp[1]:>5}\n"
        f"Node {n} HugePages_Surp:  {0:>5}\n"
    )


def write(name: str, *, kernel: str, mem: dict[str, int], pools: dict[int, list[tuple[int, int]]],
          node_mem: list[tuple[int, int]], resv: int = 0) -> None:  # fmt: skip
    """pools: size kB -> per node (total, free); node_mem: per node (MemTotal kB, MemFree kB)."""
    root = HERE / name
    shutil.rmtree(root, ignore_errors=True)

    def put(rel: str, text: str) -> None:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)

    default = 2048
    d = pools.get(default, [(0, 0)] * len(node_mem))
    fields = dict(mem)
    fields.update(
        HugePages_Total=sum(t for t, _ in d),
        HugePages_Free=sum(f for _, f in d),
        HugePages_Rsvd=resv,
        HugePages_Surp=0,
        Hugepagesize=default,
        Hugetlb=sum(sz * sum(t for t, _ in per) for sz, per in pools.items()),
    )
    put("proc/meminfo", meminfo(fields))
    put("proc/sys/kernel/osrelease", kernel + "\n")
    put("proc/sys/vm/nr_hugepages", f"{fields['HugePages_Total']}\n")
    put("proc/sys/vm/nr_overcommit_hugepages", "0\n")
    put("proc/sys/vm/overcommit_memory", "0\n")
    put("proc/sys/vm/overcommit_ratio", "50\n")
    nodes = ",".join(str(i) for i in range(len(node_mem)))
    nodes = f"0-{len(node_mem) - 1}" if len(node_mem) > 1 else "0"
    for key in ("online", "possible", "has_memory"):
        put(f"sys/devices/system/node/{key}", nodes + "\n")
    for size, per in pools.items():
        g = f"sys/kernel/mm/hugepages/hugepages-{size}kB"
        put(f"{g}/nr_hugepages", f"{sum(t for t, _ in per)}\n")
        put(f"{g}/free_hugepages", f"{sum(f for _, f in per)}\n")
        put(f"{g}/resv_hugepages", f"{resv if size == default else 0}\n")
        put(f"{g}/surplus_hugepages", "0\n")
        put(f"{g}/nr_overcommit_hugepages", "0\n")
        for n, (t, f) in enumerate(per):
            nd = f"sys/devices/system/node/node{n}/hugepages/hugepages-{size}kB"
            put(f"{nd}/nr_hugepages", f"{t}\n")
            put(f"{nd}/free_hugepages", f"{f}\n")
            put(f"{nd}/surplus_hugepages", "0\n")
    for n, (total, free) in enumerate(node_mem):
        put(f"sys/devices/system/node/node{n}/meminfo", node_meminfo(n, total, free, d[n]))


def main() -> None:
    # Report 1: 8192 x 2 MiB pages all free; MemAvailable 12,478,000 kB -> "2.04 GB free".
    write(
        "report1-7.05GB",
        kernel="6.8.0-45-generic",
        mem={
            "MemTotal": 32_598_112,
            "MemFree": 11_020_500,
            "MemAvailable": 12_478_000,
            "Buffers": 120_000,
            "Cached": 1_900_000,
        },  # fmt: skip
        pools={2048: [(8192, 8192)], 1048576: [(0, 0)]},
        node_mem=[(32_598_112, 11_020_500)],
    )
    # Report 2: 1772 GiB, 809,984 x 2 MiB pages (1582 GiB) reserved; MemAvailable 113,825,000 kB.
    write(
        "report2-176.71GB",
        kernel="5.15.0-105-generic",
        mem={
            "MemTotal": 1772 * GiB_KB,
            "MemFree": 110_000_000,
            "MemAvailable": 113_825_000,
            "Cached": 4_000_000,
        },  # fmt: skip
        pools={2048: [(404_992, 404_992), (404_992, 404_992)], 1048576: [(0, 0), (0, 0)]},
        node_mem=[(886 * GiB_KB, 55_000_000), (886 * GiB_KB, 55_000_000)],
    )
    # The 100 GB worked example's host: 2 x 256 GiB, no pool.
    write(
        "no-pool-512g",
        kernel="6.8.0-45-generic",
        mem={"MemTotal": 512 * GiB_KB, "MemFree": 480 * GiB_KB, "MemAvailable": 470 * GiB_KB},
        pools={2048: [(0, 0), (0, 0)], 1048576: [(0, 0), (0, 0)]},
        node_mem=[(256 * GiB_KB, 240 * GiB_KB), (256 * GiB_KB, 240 * GiB_KB)],
    )
    # DPDK "Not enough memory available on socket 0! Requested: 4096MB, available: 32MB":
    # HugePages_Total 9000, Free 8984; node 0 has 16 free pages (32 MiB).
    for kernel in ("5.15.0-105-generic", "4.18.0-513.el8.x86_64"):
        write(
            f"dpdk-socket0-{kernel.split('-')[0]}",
            kernel=kernel,
            mem={"MemTotal": 128 * GiB_KB, "MemFree": 100 * GiB_KB, "MemAvailable": 98 * GiB_KB},
            pools={2048: [(32, 16), (8968, 8968)], 1048576: [(0, 0), (0, 0)]},
            node_mem=[(64 * GiB_KB, 40 * GiB_KB), (64 * GiB_KB, 30 * GiB_KB)],
        )
    # Per-node exhaustion: the whole pool on node 0, nothing on node 1.
    for kernel in ("6.8.0-45-generic", "5.10.0-28-amd64"):
        write(
            f"pool-on-node0-{kernel.split('-')[0]}",
            kernel=kernel,
            mem={"MemTotal": 128 * GiB_KB, "MemFree": 120 * GiB_KB, "MemAvailable": 118 * GiB_KB},
            pools={2048: [(1024, 1024), (0, 0)], 1048576: [(0, 0), (0, 0)]},
            node_mem=[(64 * GiB_KB, 58 * GiB_KB), (64 * GiB_KB, 62 * GiB_KB)],
        )
    # 1 GiB pages asked for: the 1 GiB pool is empty, the 2 MiB pool large.
    write(
        "empty-1g-pool",
        kernel="6.8.0-45-generic",
        mem={"MemTotal": 128 * GiB_KB, "MemFree": 100 * GiB_KB, "MemAvailable": 98 * GiB_KB},
        pools={2048: [(4096, 4096), (4096, 4096)], 1048576: [(0, 0), (0, 0)]},
        node_mem=[(64 * GiB_KB, 44 * GiB_KB), (64 * GiB_KB, 44 * GiB_KB)],
    )


if __name__ == "__main__":
    main()
