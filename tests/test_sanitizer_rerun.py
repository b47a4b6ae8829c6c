"""tools/sanitizers/run.py: which sanitizer logs fail a run, and the one rerun of tests that
failed only because LeakSanitizer's own tracer crashed at a process's exit."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

RUN_PY = Path(__file__).resolve().parents[1] / "tools" / "sanitizers" / "run.py"

TRACER_CRASH_LOG = (
    "Tracer caught signal 11: addr=0x3878 pc=0x7ff1a76e80f0 sp=0x7ff19e0e3d10\n"
    "==10067==LeakSanitizer has encountered a fatal error.\n"
    "==10067==HINT: For debugging, try setting environment variable "
    "LSAN_OPTIONS=verbosity=1:log_threads=1\n"
)
LEAK_LOG = "==7==ERROR: LeakSanitizer: detected memory leaks\n\nDirect leak of 24 byte(s)\n"


@pytest.fixture(scope="module")
def run_py() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sanitizer_run", RUN_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_logs_count_reports_and_tracer_crashes_apart(run_py: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "asan.1").write_text(TRACER_CRASH_LOG)
    (tmp_path / "asan.2").write_text(LEAK_LOG)
    (tmp_path / "asan.3").write_text("Suppressions used:\n  count      bytes template\n")
    # A process whose tracer crashed after a report is a report, not a crash to forgive.
    (tmp_path / "asan.4").write_text(LEAK_LOG + TRACER_CRASH_LOG)
    assert run_py.report_logs(tmp_path) == (2, 1)


def test_failed_tests_are_named_as_pytest_names_them(
    run_py: ModuleType, pytester: pytest.Pytester
) -> None:
    pytester.makepyfile(
        test_mixed="""
        import pytest

        def test_passes():
            pass

        def test_fails():
            assert False

        @pytest.mark.parametrize("v", ["a.b", 2])
        def test_param(v):
            assert v == 2

        class TestGroup:
            def test_method(self):
                assert False

        @pytest.fixture
        def broken():
            raise RuntimeError("setup")

        def test_error(broken):
            pass
        """
    )
    junit = pytester.path / "junit.xml"
    pytester.runpytest_subprocess("-p", "no:cacheprovider", *run_py.junit_args(junit))
    failed = run_py.failed_tests(junit)
    assert failed == [
        "test_mixed.py::test_fails",
        "test_mixed.py::test_param[a.b]",
        "test_mixed.py::TestGroup::test_method",
        "test_mixed.py::test_error",
    ]
    # Each name selects its test again, and nothing else.
    again = pytester.runpytest_subprocess("-p", "no:cacheprovider", *failed)
    again.assert_outcomes(failed=3, errors=1)


class FakeRuns:
    """run_once stand-in: the first run writes a JUnit file with the given failures."""

    def __init__(self, run_py: ModuleType, outcomes: list[tuple[int, int, int]], failed: int):
        self.run_py, self.outcomes, self.failed = run_py, outcomes, failed
        self.commands: list[list[str]] = []

    def __call__(self, sanitizer: str, preload: list[str], cmd: list[str], tmp: Path) -> object:
        self.commands.append(cmd)
        if len(self.commands) == 1:
            cases = "".join(
                f'<testcase classname="tests.test_x" name="test_{i}" file="tests/test_x.py">'
                "<failure message='assert 1 == 0'/></testcase>"
                for i in range(self.failed)
            )
            junit = f"<testsuites><testsuite>{cases}</testsuite></testsuites>"
            (tmp / "junit.xml").write_text(junit)
        return self.run_py.Outcome(*self.outcomes[len(self.commands) - 1])


CMD = ["pytest", "-p", "no:cacheprovider", "-m", "not browser"]


def test_tests_failed_by_a_tracer_crash_run_once_more(
    run_py: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = FakeRuns(run_py, [(1, 0, 1), (0, 0, 0)], failed=1)
    monkeypatch.setattr(run_py, "run_once", runs)
    assert run_py.run_retrying_tracer_crashes("address", [], CMD, tmp_path) == 0
    assert runs.commands == [
        [*CMD, *run_py.junit_args(tmp_path / "junit.xml")],
        [*CMD, "tests/test_x.py::test_0"],
    ]


@pytest.mark.parametrize(
    "first, failed, why",
    [
        ((1, 1, 1), 1, "a process reported"),
        ((1, 0, 0), 1, "no tracer crashed"),
        ((1, 0, 1), 2, "more tests failed than tracers crashed"),
        ((1, 0, 1), 0, "nothing to name again (pytest itself failed)"),
    ],
)
def test_no_second_run_when_a_crash_cannot_explain_the_failure(
    run_py: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    first: tuple[int, int, int],
    failed: int,
    why: str,
) -> None:
    runs = FakeRuns(run_py, [first], failed=failed)
    monkeypatch.setattr(run_py, "run_once", runs)
    assert run_py.run_retrying_tracer_crashes("address", [], CMD, tmp_path) == 1, why
    assert len(runs.commands) == 1, why


def test_a_failing_rerun_fails(
    run_py: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = FakeRuns(run_py, [(1, 0, 1), (1, 0, 0)], failed=1)
    monkeypatch.setattr(run_py, "run_once", runs)
    assert run_py.run_retrying_tracer_crashes("address", [], CMD, tmp_path) == 1
    assert len(runs.commands) == 2


def test_only_pytest_is_run_again(
    run_py: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = FakeRuns(run_py, [(1, 0, 1)], failed=0)
    monkeypatch.setattr(run_py, "run_once", runs)
    assert run_py.run_retrying_tracer_crashes("address", [], ["bash", "loop.sh"], tmp_path) == 1
    assert runs.commands == [["bash", "loop.sh"]]
    assert run_py.is_pytest(["python", "-m", "pytest", "-q"])
    assert not run_py.is_pytest(["setarch", "x86_64", "-R", "pytest"])
