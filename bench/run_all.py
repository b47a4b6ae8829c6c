"""Runs every bench/bench_*.py, prints one table and writes one JSON file.

    python bench/run_all.py [--quick] [--out bench/results.json] [--only NAME ...]

The convention a benchmark follows is in bench/README.md. A benchmark that raises (or whose
subprocess fails) becomes an "(error)" row saying why in one line (no traceback) and makes the exit
status 1; figures that miss their
target are marked NO in the table but do not change the exit status (numbers, not tests).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import inspect
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import table  # noqa: E402


def discover(only: list[str] | None) -> list[Path]:
    found = sorted(HERE.glob("bench_*.py"))
    if only:
        found = [p for p in found if p.stem.removeprefix("bench_") in only or p.stem in only]
    return found


def run_one(path: Path, args: list[str]) -> dict[str, Any]:
    """In-process through main(argv) -> dict; else a subprocess printing JSON with --json."""
    name = path.stem.removeprefix("bench_")
    try:
        spec = importlib.util.spec_from_file_location(f"umbp_bench_{name}", path)
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        if hasattr(mod, "main") and not inspect.signature(mod.main).parameters:
            result = own_format(path, name)
        elif hasattr(mod, "main"):
            result = mod.main(list(args))
        else:
            out = subprocess.run(
                [sys.executable, str(path), "--json", *args],
                capture_output=True,
                text=True,
                check=True,
            )
            result = json.loads(out.stdout)
        if not isinstance(result, dict) or not isinstance(result.get("figures"), list):
            raise TypeError(f"{path.name} returned no {{'figures': [...]}} dict")
        result.setdefault("bench", name)
        return result
    except Exception as e:  # one broken benchmark must not hide the others' numbers
        why = failure(e)
        print(f"run_all: {path.name}: {why}", file=sys.stderr, flush=True)
        return {"bench": name, "figures": [], "error": why}


def failure(e: BaseException) -> str:
    """One line saying why a benchmark failed: the exception, and for a failed subprocess the
    last line it wrote on stderr (whatever it captured: text, bytes or nothing)."""
    why = f"{type(e).__name__}: {e}".splitlines()[0]
    stderr = getattr(e, "stderr", None)
    if isinstance(stderr, bytes):
        stderr = stderr.decode("utf-8", "replace")
    lines = [line.strip() for line in (stderr or "").splitlines() if line.strip()]
    return f"{why} ({lines[-1]})" if lines else why


def own_format(path: Path, name: str) -> dict[str, Any]:
    """A benchmark whose main() takes no argv predates the convention: run it as it is (no
    --quick), keep its output in results.json, and show one row saying so."""
    out = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, check=True
    ).stdout
    row = {
        "name": "(own output format: see results.json)",
        "value": None,
        "spread": None,
        "n": 0,
        "unit": "",
        "target": None,
        "ok": None,
        "note": "main() takes no argv: not in bench/README.md's convention yet",
    }
    return {"bench": name, "figures": [row], "output": out}


def machine() -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "host": platform.node(),
        "kernel": platform.release(),
        "arch": platform.machine(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_avg_at_start": list(os.getloadavg()),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="short runs (a smoke test, not numbers)")
    p.add_argument("--out", type=Path, default=HERE / "results.json", help="JSON output file")
    p.add_argument("--only", nargs="+", metavar="NAME", help="only these benchmarks")
    args = p.parse_args(argv)

    started = datetime.datetime.now(datetime.timezone.utc)
    info = machine()
    results = []
    for path in discover(args.only):
        print(f"run_all: {path.name} ...", file=sys.stderr, flush=True)
        results.append(run_one(path, ["--quick"] if args.quick else []))
    doc = {
        "started": started.isoformat(timespec="seconds"),
        "quick": args.quick,
        "machine": info,
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(
        f"{info['cpu']} x{info['cpus']}, Linux {info['kernel']}, Python {info['python']}, "
        f"load {info['load_avg_at_start'][0]:.1f} at start"
    )
    print(table(results))
    print(f"(written to {args.out})")
    return 1 if any(r.get("error") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
