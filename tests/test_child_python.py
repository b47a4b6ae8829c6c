"""umbp-sim's Python children import the parent's umbp_sim, whatever their working directory."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from umbp_sim.vocabulary.child_python import module_argv


def _source_tree_without_native(tmp_path: Path) -> Path:
    # What a checkout of umbp-sim looks like to `python -m`: an umbp_sim that cannot load.
    pkg = tmp_path / "umbp_sim"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('the source tree was imported')\n")
    return tmp_path


def _env() -> dict[str, str]:
    # As a user's shell has it: the test run's PYTHONSAFEPATH (conftest) would hide the problem.
    return {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}


def test_the_child_runs_the_parents_package_with_its_arguments(tmp_path: Path) -> None:
    # From an installed wheel, plain `python -m` here imports the checkout's umbp_sim and fails
    # (an editable install's import hook would not: it comes before sys.path).
    cwd = _source_tree_without_native(tmp_path)
    proc = subprocess.run(
        module_argv("umbp_sim.cli", "profiles", "--help"),
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "usage: umbp-sim profiles" in proc.stdout


def test_safe_path_mode_keeps_the_path_the_parent_has(tmp_path: Path) -> None:
    # Under -P / PYTHONSAFEPATH there is no working-directory entry to drop: nothing else goes.
    env = dict(os.environ, PYTHONSAFEPATH="1", PYTHONPATH=str(tmp_path / "extra"))
    code = "import sys, json; print(json.dumps(sys.path))"
    (tmp_path / "show_path.py").write_text(code + "\n")
    argv = module_argv("show_path")
    argv[3] = str(tmp_path)  # the "package root" here is where show_path.py lies
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    path = json.loads(proc.stdout)
    assert path[0] == str(tmp_path)
    assert path[1] == str(tmp_path / "extra")
