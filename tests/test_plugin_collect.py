"""The pytest plugin collects only umbp-sim scenario files (issue 18, item 1).

Every pytest session in an environment with umbp-sim installed loads the plugin (the pytest11
entry point), so it must leave other projects' .toml files alone: a scratch project with its own
``scenarios/load.toml`` runs exactly its own tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

LIBRARY = Path(__file__).resolve().parent.parent / "scenarios"

SCENARIO = """\
[scenario]
name = "alloc-4k"
description = "one 4 KiB anonymous buffer on a small host"

[machine]
nodes = 1
mem_per_node = "1GiB"

[request]
size = 4096

[expect]
outcome = "ok"
actual_backing = "Anonymous"
no_leaks = true
"""

OTHER_TOML = """\
# a load-test profile of some other tool
name = "load"
users = 100
ramp = "30s"
"""


def test_other_projects_toml_files_are_not_collected(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", **{"scenarios/load": OTHER_TOML})
    pytester.makepyfile(test_app="def test_app():\n    assert 1 + 1 == 2\n")
    result = pytester.runpytest("-v")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*test_app.py::test_app PASSED*"])
    result.stdout.no_fnmatch_line("*load.toml*")  # not "*load*": pytest warnings can say "autoload"


def test_a_file_declaring_itself_is_collected_anywhere(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", **{"checks/alloc": "umbp_sim_scenario = 1\n" + SCENARIO})
    pytester.makefile(".toml", **{"scenarios/load": OTHER_TOML})
    result = pytester.runpytest("-v")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*checks/alloc.toml::alloc PASSED*"])


def test_ini_option_names_the_scenario_folders(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\numbp_sim_scenarios =\n    sims\n")
    pytester.makefile(".toml", **{"sims/deep/alloc": SCENARIO})  # no marker: the folder says
    pytester.makefile(".toml", **{"other/alloc": SCENARIO})  # no marker, not a named folder
    result = pytester.runpytest("-v")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*sims/deep/alloc.toml::alloc PASSED*"])
    result.stdout.no_fnmatch_line("*other/alloc*")


def test_a_declared_file_that_is_bad_fails_with_one_line(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", **{"checks/broken": "umbp_sim_scenario = 1\n[scenario\n"})
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*checks/broken.toml: invalid TOML: *"])


def test_a_failing_scenario_reports_the_difference(pytester: pytest.Pytester) -> None:
    wrong = SCENARIO.replace('outcome = "ok"', 'outcome = "demoted"')
    pytester.makefile(".toml", **{"checks/wrong": "umbp_sim_scenario = 1\n" + wrong})
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*outcome*demoted*ok*"])


def test_the_marker_value_is_checked(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", **{"checks/v2": "umbp_sim_scenario = 2\n" + SCENARIO})
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*checks/v2.toml: umbp_sim_scenario: must be 1 (the scenario format version), not 2"]
    )


def test_every_bundled_scenario_declares_itself() -> None:
    files = sorted(LIBRARY.rglob("*.toml"))
    assert len(files) > 50
    missing = [
        str(f.relative_to(LIBRARY))
        for f in files
        if f.read_text(encoding="utf-8").splitlines()[0] != "umbp_sim_scenario = 1"
    ]
    assert missing == []


def test_forbid_skips_fails_a_session_that_skipped(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(
        test_x="import pytest\n\ndef test_a():\n    pass\n\n"
        "def test_b():\n    pytest.skip('needs a pool')\n"
    )
    monkeypatch.delenv("UMBP_SIM_FORBID_SKIPS", raising=False)
    assert pytester.runpytest_subprocess().ret == 0
    monkeypatch.setenv("UMBP_SIM_FORBID_SKIPS", "1")
    result = pytester.runpytest_subprocess()
    assert result.ret == 1
    assert result.errlines[-2:] == [
        "UMBP_SIM_FORBID_SKIPS=1: 1 skipped, each a missing test:",
        "  test_x.py::test_b: Skipped: needs a pool",
    ]
