"""tools/sanitizers/run.py: which sanitizer logs fail a run. A process whose LeakSanitizer died
in its own tracer was never checked for leaks: that fails the run like a report, even where the
test that started the process did not look at its exit status."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

RUN_PY = Path(__file__).resolve().parents[1] / "tools" / "sanitizers" / "run.py"

TRACER_CRASH_LOG = (
    "Tracer caught signal 11: addr=0x3258 pc=0x7f4dd8ce80f0 sp=0x7f4dcfe7cd10\n"
    "==16678==LeakSanitizer has encountered a fatal error.\n"
    "==16678==HINT: For debugging, try setting environment variable "
    "LSAN_OPTIONS=verbosity=1:log_threads=1\n"
)
LEAK_LOG = "==7==ERROR: LeakSanitizer: detected memory leaks\n\nDirect leak of 24 byte(s)\n"
STATISTICS_LOG = "Suppressions used:\n  count      bytes template\n"


@pytest.fixture(scope="module")
def run_py() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sanitizer_run", RUN_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "logs, fails",
    [
        ([STATISTICS_LOG], 0),
        ([LEAK_LOG, STATISTICS_LOG], 1),
        ([TRACER_CRASH_LOG], 1),
        ([TRACER_CRASH_LOG, LEAK_LOG, STATISTICS_LOG], 1),
        ([], 0),
    ],
)
def test_reports_and_tracer_crashes_fail_the_run(
    run_py: ModuleType, tmp_path: Path, logs: list[str], fails: int
) -> None:
    for i, text in enumerate(logs):
        (tmp_path / f"asan.{100 + i}").write_text(text)
    assert run_py.report_logs(tmp_path) == fails


def test_leak_checks_do_not_follow_dynamic_tls(run_py: ModuleType, tmp_path: Path) -> None:
    # The libasan this project builds with misreads glibc's dynamic TLS and its leak check then
    # dies at exit in some memory layouts; the run keeps that interception off.
    env = run_py.sanitizer_env("address", ["/lib/libasan.so"], tmp_path)
    options = dict(o.split("=", 1) for o in env["ASAN_OPTIONS"].split(":"))
    assert options["intercept_tls_get_addr"] == "0"
    assert options["detect_leaks"] == "1"
