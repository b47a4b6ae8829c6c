"""bench/run_all.py: a benchmark that fails is one row saying why, never a traceback."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def run_all():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("umbp_bench_run_all", BENCH / "run_all.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.path.remove(str(BENCH))  # run_all puts bench/ first for its _common


BROKEN = {
    # a subprocess run without capturing: CalledProcessError.stderr is None
    "no_stderr": (
        "import subprocess\ndef main(argv=None):\n    subprocess.run(['false'], check=True)\n",
        "CalledProcessError: Command '['false']' returned non-zero exit status 1.",
    ),
    "bytes_stderr": (
        "import subprocess\n"
        "def main(argv=None):\n"
        "    raise subprocess.CalledProcessError(2, 'cc', stderr=b'x.c:1: error: nope\\n\\n')\n",
        "CalledProcessError: Command 'cc' returned non-zero exit status 2. (x.c:1: error: nope)",
    ),
    "raises": (
        "def main(argv=None):\n    raise RuntimeError('needs a pool\\nsecond line')\n",
        "RuntimeError: needs a pool",
    ),
    "no_figures": ("def main(argv=None):\n    return {}\n", "TypeError: bench_no_figures.py"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_failing_benchmark_is_a_row_saying_why(
    run_all, case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    source, why = BROKEN[case]
    path = tmp_path / f"bench_{case}.py"
    path.write_text(source)
    result = run_all.run_one(path, [])
    assert result["bench"] == case and result["figures"] == []
    assert result["error"].startswith(why), result["error"]
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err == f"run_all: {path.name}: {result['error']}\n"
