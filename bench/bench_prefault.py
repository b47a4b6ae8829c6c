"""Benchmark 6: real prefault of a 1 GiB anonymous buffer on this host.

MADV_POPULATE_WRITE (the allocator's prefault) and one write per page (its fallback on kernels
before 5.14), in GB/s, against memset of the same size: on a fresh mapping (faults + writes)
and on a populated one (the memory-bandwidth ceiling). Native code (bench_prefault.cpp).

    python bench/bench_prefault.py [--quick] [--json] [--size BYTES]
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import build_native, emit, figure, ratios  # noqa: E402

HERE = Path(__file__).resolve().parent
GIB = 1 << 30


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    quick = "--quick" in argv
    size = GIB // 4 if quick else GIB
    if "--size" in argv:
        size = int(argv[argv.index("--size") + 1])
    rounds = 3 if quick else 7

    exe = build_native(HERE / "bench_prefault.cpp")
    out = subprocess.run([str(exe), str(size), str(rounds)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{exe.name} exited {out.returncode}: {out.stderr.strip()}")
    sec: dict[str, list[float]] = json.loads(out.stdout)
    gbs = {k: [size / t / 1e9 for t in v] for k, v in sec.items()}
    label = f"{size // (1 << 20)} MiB"
    figs = [
        figure(f"MADV_POPULATE_WRITE {label}", gbs["populate"], unit="GB/s"),
        figure(f"touch 1 byte / 4 KiB page {label}", gbs["touch"], unit="GB/s"),
        figure(f"memset fresh mapping {label}", gbs["memset_fresh"], unit="GB/s"),
        figure(f"memset populated {label} (ceiling)", gbs["memset_warm"], unit="GB/s"),
        figure(
            "POPULATE_WRITE speed / manual touch",
            ratios(sec["touch"], sec["populate"]),
            note="> 1: populate is faster",
        ),
        figure(
            "POPULATE_WRITE speed / memset ceiling", ratios(sec["memset_warm"], sec["populate"])
        ),
    ]
    return {"bench": "prefault", "figures": figs, "raw": {"seconds": sec, "size": size}}


if __name__ == "__main__":
    emit(main(), sys.argv[1:])
