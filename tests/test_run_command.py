"""`umbp-sim run` and the pytest collection of scenario files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from umbp_sim.cli import main

PASSING = """
[scenario]
name = "absent-pool"
description = "no 2 MiB pages: hugetlb demotes"

[machine]
nodes = 1

[request]
size = "4MiB"
backing = "AnonymousHugetlb"

[expect]
outcome = "demoted"
actual_backing = "Anonymous"
no_leaks = true
"""

# Expects hugetlb where the host has no pool: must fail, and say what differed.
FAILING = PASSING.replace('name = "absent-pool"', 'name = "wrong-expectation"').replace(
    'outcome = "demoted"\nactual_backing = "Anonymous"', 'outcome = "ok"'
)


@pytest.fixture
def library(tmp_path: Path) -> Path:
    d = tmp_path / "scenarios"
    d.mkdir()
    (d / "a.toml").write_text(PASSING)
    (d / "b.toml").write_text(FAILING)
    return d


def test_run_table_and_exit_code(library: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(library)]) == 1
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.endswith(("PASS", "FAIL"))}
    assert rows["absent-pool"].split()[-1] == "PASS"
    assert rows["wrong-expectation"].split()[-1] == "FAIL"
    assert "outcome: expected 'ok', got 'demoted'" in out
    # the failure report carries the syscall trace
    assert "MAP_HUGETLB|MAP_HUGE_2MB, -1, 0) = -1 ENOMEM" in out
    assert out.rstrip().endswith("1 passed, 1 failed")


def test_run_selects_with_k(library: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(library), "-k", "absent"]) == 0
    out = capsys.readouterr().out
    assert "wrong-expectation" not in out
    assert out.rstrip().endswith("1 passed, 0 failed")


def test_run_json(library: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(library / "a.toml"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["passed"], doc["failed"]) == (1, 0)
    obs = doc["scenarios"][0]["observed"]
    assert obs["outcome"] == "demoted" and obs["actual_backing"] == "Anonymous"


def test_run_no_match_is_a_failure(library: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(library), "-k", "nothing-like-this"]) == 1
    assert "no scenario matched" in capsys.readouterr().err


def test_run_bad_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(PASSING.replace("[expect]", "[expect]\nbogus = 1"))
    assert main(["run", str(bad)]) == 65
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert f"{bad}: [expect].bogus: unknown key" in err


def test_run_missing_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(tmp_path / "nope")]) == 65
    assert "no such file or directory" in capsys.readouterr().err


def test_bundled_library_runs_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "-k", "hugepages-absent-demotes"]) == 0
    assert "hugepages-absent-demotes" in capsys.readouterr().out


def test_pytest_collects_scenario_files(library: Path) -> None:
    # The files do not declare themselves (umbp_sim_scenario = 1): the ini option names the folder
    (library.parent / "pytest.ini").write_text(f"[pytest]\numbp_sim_scenarios = {library.name}\n")
    proc = subprocess.run(
        [sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider", str(library)],
        capture_output=True,
        text=True,
        cwd=library.parent,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 failed, 1 passed" in proc.stdout
    # the failure report is the scenario's own, not a Python traceback
    assert "outcome: expected 'ok', got 'demoted'" in proc.stdout
    assert "Traceback" not in proc.stdout
