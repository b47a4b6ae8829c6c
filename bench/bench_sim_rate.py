"""Benchmark 2: simulated alloc+free per second from Python, against a pure-Python fake.

The fake is the kind sglang's own tests use in place of mori.umbp: ctypes buffers and Python
bookkeeping (rounding, a handle object, a dict of live buffers). It models nothing of the
kernel. umbp-sim runs the real allocator on a SimKernel (hugepage pools, reservations,
overcommit, NUMA policy, /proc rendering) and should still be at least as fast (target >= 1).

Both do the same calls: alloc(size, backing) then free(handle), for 4 KiB Anonymous and
2 MiB AnonymousHugetlb. Needs an installed umbp-sim with the simulator.

    python bench/bench_sim_rate.py [--quick] [--json]
"""

from __future__ import annotations

import ctypes
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, figure, ratios, unavailable  # noqa: E402

KIB4, MIB2 = 4096, 2 << 20


class FakeHandle:
    def __init__(self, ptr: int, requested: int, mapped: int, backing: int, align: int) -> None:
        self.ptr, self.requested_size, self.mapped_size = ptr, requested, mapped
        self.actual_backing, self.actual_alignment = backing, align

    def __bool__(self) -> bool:
        return self.ptr != 0


class FakeAllocator:
    """What a test double for mori.umbp looks like: real bytes from ctypes, no kernel model."""

    def __init__(self) -> None:
        self.live: dict[int, ctypes.Array[ctypes.c_char]] = {}

    def alloc(self, size: int, backing: int = 0, hugepage_size: int = MIB2, numa_node: int = -1,
              prefault: bool = True) -> FakeHandle:  # fmt: skip
        if size <= 0:
            return FakeHandle(0, 0, 0, backing, 0)
        align = hugepage_size if backing in (1, 3) else KIB4
        mapped = (size + align - 1) // align * align
        buf = ctypes.create_string_buffer(mapped)
        h = FakeHandle(ctypes.addressof(buf), size, mapped, backing, align)
        self.live[h.ptr] = buf
        return h

    def free(self, h: FakeHandle) -> None:
        if self.live.pop(h.ptr, None) is not None:
            h.ptr = h.requested_size = h.mapped_size = 0


def rate(alloc: Callable[..., Any], free: Callable[[Any], None], size: int, backing: Any,
         n: int) -> float:  # fmt: skip
    t0 = time.perf_counter()
    for _ in range(n):
        h = alloc(size, backing)
        if not h:
            raise RuntimeError(f"alloc({size}, {backing}) failed")
        free(h)
    return n / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    quick = "--quick" in argv
    n, rounds = (300, 3) if quick else (3000, 9)
    try:
        import umbp_sim
        from umbp_sim.machine import Machine
        from umbp_sim.sim import simulate
    except ImportError as e:
        why = f"umbp_sim.sim not importable ({e})"
        return {
            "bench": "sim_rate",
            "figures": [unavailable(f"sim/fake {s}", why, ">= 1.0") for s in ("4 KiB", "2 MiB")],
        }

    fake = FakeAllocator()
    cases = [("4 KiB Anonymous", KIB4, 0, umbp_sim.Anonymous),
             ("2 MiB AnonymousHugetlb", MIB2, 1, umbp_sim.AnonymousHugetlb)]  # fmt: skip
    sim_rates: dict[str, list[float]] = {c[0]: [] for c in cases}
    fake_rates: dict[str, list[float]] = {c[0]: [] for c in cases}
    with simulate(Machine.x86_64(hugepages={"2MiB": 512})) as host:
        a = umbp_sim.UMBPHostMemAllocator()
        for label, size, _fb, sb in cases:  # warm-up, and check the simulated path is the one
            h = a.alloc(size, sb)
            assert h and h.actual_backing == sb, f"simulated alloc of {label} gave {h!r}"
            a.free(h)
        for _ in range(rounds):
            for label, size, fb, sb in cases:
                sim_rates[label].append(rate(a.alloc, a.free, size, sb, n))
                fake_rates[label].append(rate(fake.alloc, fake.free, size, fb, n))
        assert not host.mappings(), "the benchmark leaked simulated mappings"
    figs = []
    for label, *_ in cases:
        figs.append(figure(f"simulated alloc+free/s {label} (Python)", sim_rates[label], "1/s"))
        figs.append(figure(f"fake alloc+free/s {label} (Python)", fake_rates[label], "1/s"))
        figs.append(
            figure(
                f"simulated / fake rate {label}",
                ratios(sim_rates[label], fake_rates[label]),
                target=">= 1.0",
            )
        )
    # The same path's rate from C++ is measured by bench_passthrough (variant sim_pop).
    return {"bench": "sim_rate", "figures": figs}


if __name__ == "__main__":
    emit(main(), sys.argv[1:])
