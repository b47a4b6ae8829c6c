"""Helpers shared by the bench_*.py scripts: figures, summaries, the table, native builds.

Not required by the convention (see README.md): a benchmark only has to return the dict.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "bench"


def figure(
    name: str,
    samples: Sequence[float] | None,
    unit: str = "x",
    target: str | None = None,
    note: str = "",
    higher_is_better: bool = False,
) -> dict[str, Any]:
    """One row of the table from repeated measurements (ratios or rates): median, min..max."""
    if not samples:
        return {
            "name": name,
            "value": None,
            "spread": None,
            "n": 0,
            "unit": unit,
            "target": target,
            "ok": None,
            "note": note or "not available yet",
        }
    med = statistics.median(samples)
    return {
        "name": name,
        "value": med,
        "spread": [min(samples), max(samples)],
        "n": len(samples),
        "unit": unit,
        "target": target,
        "ok": meets(med, target),
        "note": note,
    }


def rate(name: str, count: int, seconds: Sequence[float], note: str = "") -> dict[str, Any]:
    """A throughput row: ``count`` things per second of each measured run."""
    return figure(name, [count / t for t in seconds], unit="1/s", note=note, higher_is_better=True)


def timed_run(
    cmd: Sequence[str], cwd: str | os.PathLike[str] = ROOT, ok: Sequence[int] = (0,)
) -> tuple[float, str]:
    """Wall seconds of one child process and its stdout (started with PYTHONSAFEPATH=1: the
    installed package, not the source tree); RuntimeError naming the command when its exit
    status is not in ``ok``."""
    env = dict(os.environ, PYTHONSAFEPATH="1")
    t = time.perf_counter()
    proc = subprocess.run(list(cmd), cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - t
    if proc.returncode not in ok:
        raise RuntimeError(
            f"{' '.join(cmd)} exited {proc.returncode}: {(proc.stderr or proc.stdout)[-2000:]}"
        )
    return elapsed, proc.stdout


def unavailable(name: str, why: str, target: str | None = None, unit: str = "x") -> dict[str, Any]:
    return figure(name, None, unit=unit, target=target, note=f"not available yet: {why}")


def meets(value: float, target: str | None) -> bool | None:
    """Checks `value` against a target written as '<= 1.05', '>= 50', '< 16'."""
    if not target:
        return None
    op, _, num = target.partition(" ")
    bound = float(num)
    return {
        "<=": value <= bound,
        "<": value < bound,
        ">=": value >= bound,
        ">": value > bound,
    }[op]


def ratios(num: Sequence[float], den: Sequence[float]) -> list[float]:
    """Per-round ratios of two side-by-side series."""
    return [a / b for a, b in zip(num, den, strict=True)]


def fmt_value(f: dict[str, Any]) -> str:
    v = f["value"]
    if v is None:
        return "-"
    prec = 3 if abs(v) < 10 else 1
    return f"{v:.{prec}f}"


def fmt_spread(f: dict[str, Any]) -> str:
    s = f["spread"]
    if not s:
        return ""
    prec = 3 if abs(s[1]) < 10 else 1
    return f"{s[0]:.{prec}f}..{s[1]:.{prec}f} (n={f['n']})"


def table(results: Sequence[dict[str, Any]]) -> str:
    """The benchmarks' figures as one plain-text table (also valid Markdown)."""
    rows = [("bench", "figure", "median", "unit", "spread (min..max)", "target", "ok", "note")]
    for r in results:
        for f in r.get("figures", []):
            ok = {True: "yes", False: "NO", None: ""}[f.get("ok")]
            rows.append(
                (
                    r.get("bench", "?"),
                    f["name"],
                    fmt_value(f),
                    f.get("unit", ""),
                    fmt_spread(f),
                    f.get("target") or "",
                    ok,
                    f.get("note", ""),
                )
            )
        if r.get("error"):
            rows.append((r.get("bench", "?"), "(error)", "-", "", "", "", "NO", r["error"]))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for i, row in enumerate(rows):
        lines.append(
            "| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
        )
        if i == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def emit(result: dict[str, Any], argv: Sequence[str]) -> None:
    """What a bench script does when run directly: JSON with --json, else the table."""
    if "--json" in argv:
        print(json.dumps(result, indent=2))
    else:
        print(table([result]))


def build_native(source: Path, sources: Sequence[Path] = (), defines: Sequence[str] = ()) -> Path:
    """Compiles a benchmark program with g++ -O2 against csrc/, cached under build/bench/ by a
    hash of every input (so an edited allocator is rebuilt)."""
    cxx = os.environ.get("CXX") or shutil.which("g++") or "c++"
    h = hashlib.sha256()
    for p in [source, *sources]:
        h.update(str(p).encode())
        h.update(p.read_bytes())
    for d in defines:
        h.update(d.encode())
    for hdr in sorted((ROOT / "csrc").rglob("*.h")):
        h.update(hdr.read_bytes())
    exe = BUILD / f"{source.stem}-{h.hexdigest()[:12]}"
    if exe.exists():
        return exe
    BUILD.mkdir(parents=True, exist_ok=True)
    cmd = [
        cxx,
        "-O2",
        "-std=c++17",
        "-Wall",
        "-Wextra",
        f"-I{ROOT / 'csrc'}",
        *[f"-D{d}" for d in defines],
        str(source),
        *map(str, sources),
        "-pthread",
        "-o",
        str(exe) + ".tmp",
    ]
    print(f"bench: building {exe.name} ...", file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True)
    os.replace(str(exe) + ".tmp", exe)
    return exe
