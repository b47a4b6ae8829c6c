"""Benchmark: the full matrix on its small hosts, and what it still covers (issue 41, item 6).

The full matrix's hosts have 8 GiB nodes (``matrix.FULL_MEM_PER_NODE``), where they had 64 GiB:
a 1 TiB request touched by hand on a kernel before 5.14 touches the whole host before the OOM
kill, so its run cost what the host held, not what the allocator did. Figures:

- the time of ``umbp-sim compare umbp-sim TINY --matrix full --no-scenarios --jobs 2`` (the
  test allocator, an external build: a forked process per run), estimated from every 61st
  group of a fault-free run and its seven faulted runs and from two groups (the start-up),
  target <= 15 min on 2 cores; side by side, the same without taking a fault-free run's
  comparison for the faulted runs whose fault cannot fire (a ratio); and over ``--shard 1/61``
  (every 61st run, as bench_external_run estimates it), where few runs follow their twin;
- the time of one shard on 8 GiB against 64 GiB nodes, side by side (a ratio);
- the quick matrix's 100 GiB buffers of base pages prefaulted on 4.18 (touched by hand, a page
  at a time: 26 million pages, one fault and one SimKernel call a granted run), seconds a run;
- the classes of behaviour the full matrix covers, on both host sizes: a run's class is what
  each built-in allocator did (outcome, failure, backing, signal and stage, warning ids, the
  rules of SimKernel's reasons, whether it held a mapping or fd) and the classes in which the
  two differ; every run of the matrix, in process. The two sets must be equal;
- the kills of a mutant set (the test allocator's planted variants, tests/external/conftest.py)
  over a prime shard of the matrix on both host sizes: which classes of ``compare`` each
  variant differs in from the test allocator. The two must be equal.

    python bench/bench_full_matrix.py [--quick] [--json]
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import BUILD, emit, figure, ratios, unavailable  # noqa: E402
from bench_compare import TINY, build_tiny  # noqa: E402
from bench_external_run import _full_matrix_minutes, _observe_times  # noqa: E402

OLD_MEM = "64GiB"  # the full matrix's nodes before issue 41
# The test allocator's planted variants (tests/external/tiny_allocator.cpp): each is a bug.
MUTANTS = (
    "TINY_WRONG_NODE", "TINY_STRIDE_BUG", "TINY_FREE_KEEPS_HANDLE", "TINY_NO_OVERFLOW_CHECK",
    "TINY_SIZE_32", "TINY_REQUESTED_ROUNDED", "TINY_POPULATE_READ", "TINY_SHM_PRIVATE",
    "TINY_NO_CLOEXEC", "TINY_OFFSET_32",
)  # fmt: skip


def quick_matrix() -> list[Any]:
    from umbp_sim.comparison import matrix

    return list(matrix.quick())


def full_runs(mem_per_node: str, every: int = 1) -> Iterator[Any]:
    from umbp_sim.comparison import matrix

    return itertools.islice(matrix.full(mem_per_node), 0, None, every)


def behaviour(rec: Any) -> tuple[Any, ...]:
    """What an allocator did in a run, without its numbers."""
    ids = tuple(sorted({str(i) for _logger, i, _text in rec.log}))
    rules = tuple(sorted({r.rule for r in rec.reasons}))
    held = tuple(sorted(k for k, v in rec.held.items() if v))
    return (rec.outcome, rec.failure, rec.actual_backing, rec.signal, rec.stage, ids, rules, held)


def classes(mem_per_node: str, every: int) -> dict[tuple[Any, ...], int]:
    """{class: runs} over the full matrix on the built-in pair (umbp-sim, mori-624002c)."""
    from umbp_sim.allocator_spec import AllocatorSpec
    from umbp_sim.comparison.differences import differences
    from umbp_sim.run_router import BuiltinAllocator

    a = BuiltinAllocator(AllocatorSpec("builtin", "umbp-sim"))
    b = BuiltinAllocator(AllocatorSpec("builtin", "mori-624002c"))
    seen: dict[tuple[Any, ...], int] = {}
    for run in full_runs(mem_per_node, every):
        ra, rb = a.run(run), b.run(run)
        key = (behaviour(ra), behaviour(rb), tuple(sorted(differences(ra, rb))))
        seen[key] = seen.get(key, 0) + 1
    return seen


def build_mutant(define: str) -> Path:
    h = hashlib.sha256(TINY.read_bytes() + define.encode()).hexdigest()[:12]
    name = f"{define.lower()}_{h}"  # tiny_wrong_node_<hash>: the module name is the stem
    out = BUILD / f"{name}.so"
    if not out.exists():
        BUILD.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [sys.executable, "-P", "-m", "umbp_sim.cli", "build-allocator", str(TINY),
             "-D", f"TINY_MODULE_NAME={name}", "-D", define, "-o", str(out)],
            capture_output=True, text=True,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"building {define} failed: {proc.stderr.strip()[-500:]}")
    return out


def kills(
    base: Path, mutants: dict[str, Path], runs: list[Any]
) -> tuple[dict[str, list[str]], float]:
    """({mutant: the classes compare reports between the test allocator and it} over ``runs``,
    the seconds the test allocator's runs took): one server per build, one run at a time; a
    run past 10 s times out, as a 32-bit touch loop past 4 GiB does."""
    from umbp_sim.allocator_spec import parse_allocator_spec
    from umbp_sim.comparison.differences import differences
    from umbp_sim.run_router import open_allocator

    out: dict[str, list[str]] = {}
    a = open_allocator(parse_allocator_spec(str(base)), {}, 10.0)
    try:
        t = time.perf_counter()
        records = [a.run(r) for r in runs]
        seconds = time.perf_counter() - t
        for name, so in mutants.items():
            b = open_allocator(parse_allocator_spec(str(so)), {}, 10.0)
            try:
                found: set[str] = set()
                for run, ra in zip(runs, records, strict=True):
                    found |= set(differences(ra, b.run(run)))
                out[name] = sorted(found)
            finally:
                b.close()
    finally:
        a.close()
    return out, seconds


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    quick = "--quick" in argv
    if importlib.util.find_spec("pybind11") is None:
        why = "needs pybind11 to build the test allocator: pip install '.[test]'"
        return {"bench": "full_matrix", "figures": [unavailable("full matrix", why, "<= 15")]}
    tiny = build_tiny()
    figures = []
    raw: dict[str, Any] = {}
    # Classes of behaviour: every run (--quick: every 61st) on both host sizes, in process.
    every = 61 if quick else 1
    t = time.perf_counter()
    new, old = classes(matrix_mem(), every), classes(OLD_MEM, every)
    raw["classes"] = {"runs": sum(new.values()), "new": len(new), "old": len(old),
                      "only_new": [repr(k) for k in new.keys() - old.keys()],
                      "only_old": [repr(k) for k in old.keys() - new.keys()],
                      "seconds": time.perf_counter() - t}  # fmt: skip
    same = new.keys() == old.keys()
    figures.append(
        figure("full matrix: classes of behaviour (built-in pair), 8 GiB nodes", [len(new)],
               unit="classes", note=f"{'the same' if same else 'NOT the same'} as on 64 GiB "
               f"nodes ({len(old)}); {sum(new.values())} runs")
    )  # fmt: skip
    # Kills of the mutant set over a prime shard, both host sizes.
    shard = 509 if quick else 61
    mutants = {d: build_mutant(d) for d in MUTANTS}
    k_new, t_new = kills(tiny, mutants, list(full_runs(matrix_mem(), shard)))
    k_old, t_old = kills(tiny, mutants, list(full_runs(OLD_MEM, shard)))
    raw["kills"] = {"new": k_new, "old": k_old}
    figures.append(
        figure(f"test allocator over a 1/{shard} shard: 8 GiB / 64 GiB nodes, time",
               ratios([t_new], [t_old]), note=f"{t_new:.0f} s vs {t_old:.0f} s, one job")
    )  # fmt: skip
    figures.append(
        figure(f"mutants differing over a 1/{shard} shard, 8 GiB nodes",
               [sum(bool(v) for v in k_new.values())], unit="mutants",
               note=f"of {len(MUTANTS)}; classes per mutant "
               f"{'the same' if k_new == k_old else 'NOT the same'} as on 64 GiB nodes "
               f"({sum(bool(v) for v in k_old.values())} differing there)")
    )  # fmt: skip
    # Field-sized buffers touched by hand (issue 41, item 3).
    field = [r for r in quick_matrix() if r.label.startswith("[field-")]
    field = [r for r in field if "size=107374182400" in r.label and "Hugetlb" not in r.label]
    touch = _observe_times(tiny, {}, field * (1 if quick else 3))
    figures.append(
        figure("100 GiB prefault on 4.18 touched by hand, test allocator (s)", touch, unit="s",
               note="Anonymous and AnonymousShm, fork, run, reply")
    )  # fmt: skip
    # The full matrix on the test allocator, --jobs 2: every 61st group of a fault-free run and
    # its faulted runs (a faulted run whose fault cannot fire takes the fault-free run's
    # comparison: umbp_sim.comparison.fault_reuse), with and without that, side by side.
    rounds = 1 if quick else 2
    with_reuse, without = [], []
    for _ in range(rounds):
        with_reuse.append(_group_minutes(tiny, shard, reuse=True))
        without.append(_group_minutes(tiny, shard, reuse=False))
    figures.append(
        figure(f"full matrix on an external build, {os.cpu_count()} cores (min)", with_reuse,
               unit="min", target="<= 15",
               note=f"compare --jobs 2 over every {shard}th group of a run and its 7 faults")
    )  # fmt: skip
    figures.append(
        figure("full matrix: faulted runs reused / all run, time", ratios(with_reuse, without),
               note=f"{statistics.median(with_reuse):.1f} vs {statistics.median(without):.1f} min")
    )  # fmt: skip
    # A shard (every N-th run) keeps few fault-free runs next to their faulted ones.
    minutes = [_full_matrix_minutes(tiny, shard) for _ in range(rounds)]
    figures.append(
        figure(f"full matrix over --shard 1/{shard}, {os.cpu_count()} cores (min)", minutes,
               unit="min", note="the CLI, every N-th run: little to reuse")
    )  # fmt: skip
    raw["minutes"] = {"groups": with_reuse, "groups_without_reuse": without, "shard": minutes}
    return {"bench": "full_matrix", "figures": figures, "raw": raw}


def group_sample(every: int, first: int = 0, count: int | None = None) -> list[Any]:
    """Every ``every``-th group of the full matrix (a fault-free run, then its faulted runs)."""
    from umbp_sim.comparison import matrix

    group = 1 + len(matrix.FAULTS)
    runs = [r for i, r in enumerate(matrix.full()) if (i // group) % every == first]
    return runs if count is None else runs[: count * group]


def _sample_seconds(so: Path, runs: list[Any], reuse: bool) -> float:
    from umbp_sim.allocator_spec import AllocatorSpec, parse_allocator_spec
    from umbp_sim.comparison import fault_reuse
    from umbp_sim.comparison.parallel import parallel_differences

    kept = fault_reuse.FaultFreeTwin.reuse
    if not reuse:  # the workers are forked: they inherit this
        fault_reuse.FaultFreeTwin.reuse = lambda self, run: None  # type: ignore[method-assign]
    try:
        a, b = AllocatorSpec("builtin", "umbp-sim"), parse_allocator_spec(str(so))
        t = time.perf_counter()
        for _ in parallel_differences(a, b, runs, 2):
            pass
        return time.perf_counter() - t
    finally:
        fault_reuse.FaultFreeTwin.reuse = kept  # type: ignore[method-assign]


def _group_minutes(so: Path, every: int, reuse: bool) -> float:
    """The full matrix's minutes from a sample of its groups and a sample of two (the
    start-up), as _full_matrix_minutes does with shards."""
    from bench_external_run import FULL_RUNS

    big, small = group_sample(every), group_sample(every, count=2)
    big_t, small_t = _sample_seconds(so, big, reuse), _sample_seconds(so, small, reuse)
    per_run = (big_t - small_t) / (len(big) - len(small))
    startup = max(0.0, small_t - len(small) * per_run)
    return (startup + FULL_RUNS * per_run) / 60


def matrix_mem() -> str:
    from umbp_sim.comparison import matrix

    return matrix.FULL_MEM_PER_NODE


if __name__ == "__main__":
    emit(main(), sys.argv)
