"""Benchmark: the second `pip install .` is incremental (issue 18, item 2).

The README's two commands (`pip install ".[torch]"`, then `pip install ".[test,torch]"`) each
build the wheel in a new throw-away isolated environment. This builds the wheel twice, as pip
does for those commands (`pip wheel --no-deps`, build isolation on, one build directory), and
reports the second build's time as a ratio to the first. The first starts from an empty build
directory, so it compiles everything; the second should compile nothing.

    python bench/bench_build.py [--quick] [--json]

Minutes of CPU (the first build compiles the extension): `--quick` changes nothing here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, emit, figure  # noqa: E402


def _build(build_dir: Path, wheel_dir: Path) -> tuple[float, int]:
    """One isolated `pip wheel` build; (seconds, number of compile steps ninja ran)."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-v",
        "--no-deps",
        "--disable-pip-version-check",
        f"--config-settings=build-dir={build_dir}",
        "-w",
        str(wheel_dir),
        str(ROOT),
    ]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
    elapsed = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"pip wheel exited {proc.returncode}:\n{proc.stdout[-3000:]}")
    log = proc.stdout + proc.stderr
    compiled = sum(1 for line in log.splitlines() if "Building CXX object" in line)
    return elapsed, compiled


def main(argv: list[str] | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="umbp-bench-build-") as tmp:
        build_dir, wheels = Path(tmp) / "build", Path(tmp) / "wheels"
        first, first_compiled = _build(build_dir, wheels)
        second, second_compiled = _build(build_dir, wheels)
    note = (
        f"{second:.1f} s vs {first:.1f} s; compiled {second_compiled} vs {first_compiled} objects"
    )
    return {
        "bench": "build",
        "figures": [
            figure(
                "second isolated pip build / first (same build-dir)",
                [second / first],
                target="< 0.2",
                note=note,
            ),
            figure("objects recompiled by the second build", [second_compiled], unit="n"),
        ],
        "seconds": {"first": first, "second": second},
    }


if __name__ == "__main__":
    emit(main(sys.argv[1:]), sys.argv[1:])
