"""The package fits the Python ecosystem (issue 18, items 2, 3, 4 and 6): the build directory
outlives pip's build environments (bench/bench_build.py times it) with warnings as errors in
CI, the torch extra brings numpy, ``import umbp_sim`` exposes ``mori_compat``, the source
tree's ``umbp_sim/`` says what to do in one line, ``umbp-sim --version`` and every exit status
is documented."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import umbp_sim
from umbp_sim import cli
from umbp_sim.vocabulary.exit_codes import EX_CANTCREAT, EX_USAGE, EXIT_CODES

ROOT = Path(__file__).resolve().parent.parent


def _python(code: str, cwd: Path, safe_path: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    if safe_path:
        env["PYTHONSAFEPATH"] = "1"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


# ---- item 2: one build ------------------------------------------------------------------------
def test_the_build_directory_outlives_pips_build_environments() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    section = pyproject.split("[tool.scikit-build]\n")[1].split("\n[")[0]
    # relative to the project, per wheel tag: not inside pip's throw-away environment
    assert re.search(r'^build-dir = "build/\{wheel_tag\}"$', section, re.M), section
    # warnings are errors where CI builds: the option comes from the environment .ci/run sets
    assert 'UMBP_WERROR = { env = "UMBP_WERROR"' in pyproject
    assert re.search(r"^export UMBP_WERROR=ON\b", (ROOT / ".ci" / "run").read_text(), re.M)
    cmake = "\n".join(
        p.read_text(encoding="utf-8")
        for p in [ROOT / "CMakeLists.txt", *(ROOT / "csrc").rglob("CMakeLists.txt")]
    )
    assert re.search(r"if\s*\(\s*UMBP_WERROR\s*\)\s*\n[^\n]*-Werror", cmake), "no -Werror"


# ---- item 3: numpy with torch -------------------------------------------------------------
def test_torch_extra_declares_numpy() -> None:
    requires = metadata.requires("umbp-sim") or []
    torch_extra = [r for r in requires if 'extra == "torch"' in r]
    assert any(r.startswith("torch==") for r in torch_extra)
    assert any(r.startswith("numpy>=") for r in torch_extra), torch_extra


@pytest.mark.torch
def test_importing_torch_prints_no_numpy_warning(tmp_path: Path) -> None:
    proc = _python("import torch; torch.zeros(2).numpy()", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "NumPy" not in proc.stderr, proc.stderr


# ---- item 4: imports that work ------------------------------------------------------------
def test_mori_compat_is_reachable_from_the_package(tmp_path: Path) -> None:
    code = (
        "import umbp_sim\n"
        "with umbp_sim.mori_compat.mori_umbp():\n"
        "    import mori.umbp\n"
        "    print(issubclass(mori.umbp.UMBPHostMemAllocator, umbp_sim.UMBPHostMemAllocator))\n"
    )
    proc = _python(code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "True\n"


def source_tree_message(package_dir: Path) -> str:
    return (
        f"umbp_sim was imported from the source tree {package_dir} (no compiled _native "
        "there): after `pip install .`, start Python outside the repository root or with "
        "`python -P` (PYTHONSAFEPATH=1)"
    )


def test_python_started_in_the_repository_root() -> None:
    # `python -c` (like an interactive `python`) in the repository root puts the root first on
    # sys.path, so the source tree's umbp_sim/ (no compiled _native) shadows an installed
    # wheel. An editable install (tox -e coverage) maps umbp_sim to the source tree with its
    # build's _native in front of sys.path: there the import works.
    proc = _python("import umbp_sim; print(umbp_sim.__file__)", ROOT, safe_path=False)
    editable = Path(umbp_sim.__file__).resolve().parent == ROOT / "umbp_sim"
    if editable:
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == str(ROOT / "umbp_sim" / "__init__.py")
    else:
        assert proc.returncode == 1
        last = proc.stderr.strip().splitlines()[-1]
        assert last == "ImportError: " + source_tree_message(ROOT / "umbp_sim")
        assert "No module named" not in proc.stderr


def test_missing_extension_messages(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "csrc").mkdir()
    assert umbp_sim._missing_native(tmp_path / "umbp_sim") == source_tree_message(
        tmp_path / "umbp_sim"
    )
    installed = tmp_path / "site-packages" / "umbp_sim"
    assert umbp_sim._missing_native(installed) == (
        f"umbp_sim's compiled extension _native is missing from {installed}: reinstall "
        "umbp-sim (`pip install --force-reinstall umbp-sim`; building it needs a C++17 compiler)"
    )


# ---- item 6: --version and exit codes -----------------------------------------------------
def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"umbp-sim {metadata.version('umbp-sim')}\n"


def test_help_lists_every_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    listed = [int(m) for m in re.findall(r"^ +(\d+)  \S", out.split("exit status:\n")[1], re.M)]
    assert listed == list(EXIT_CODES)


def test_the_command_reference_documents_the_same_exit_codes() -> None:
    readme = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
    table = readme.split("<!-- exit-codes -->")[1].split("\n\n")[1]
    codes = [int(m) for m in re.findall(r"^\| (\d+) \|", table, re.M)]
    assert codes == list(EXIT_CODES)


def test_exit_statuses_are_named_in_one_module() -> None:
    """Every ``exit_code = N`` and ``EX_* = N`` is in umbp_sim/vocabulary/exit_codes.py; the
    stand-alone collectors (which cannot import it) use the same numbers."""
    declared = ROOT / "umbp_sim" / "vocabulary" / "exit_codes.py"
    spelled = set()
    for path in (ROOT / "umbp_sim").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if path != declared and re.search(r"\bexit_code\s*=\s*\d|^EX_\w+\s*=\s*\d", text, re.M):
            spelled.add(path.relative_to(ROOT / "umbp_sim").as_posix())
    assert spelled == {"collect_scripts/standalone_collect.py"}
    from umbp_sim.collect_scripts import standalone_collect as standalone

    assert (standalone.EX_USAGE, standalone.EX_CANTCREAT) == (EX_USAGE, EX_CANTCREAT)
    sh = (ROOT / "umbp_sim" / "collect_scripts" / "standalone_collect.sh").read_text(
        encoding="utf-8"
    )
    assert f"EX_USAGE={EX_USAGE}\n" in sh and f"EX_CANTCREAT={EX_CANTCREAT}\n" in sh
    assert set(re.findall(r"\bexit (\d+)", sh)) == {"0", "130"}  # the rest by name


def test_the_code_uses_no_undocumented_exit_code() -> None:
    used: set[int] = set()
    for path in (ROOT / "umbp_sim").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        used |= {int(n) for n in re.findall(r"\bexit_code\s*=\s*(\d+)", text)}
        used |= {int(n) for n in re.findall(r"^EX_\w+\s*=\s*(\d+)", text, re.M)}
    for path in [*(ROOT / "umbp_sim" / "commands").glob("*.py"), ROOT / "umbp_sim" / "cli.py"]:
        text = path.read_text(encoding="utf-8")
        used |= {int(n) for n in re.findall(r"\breturn (\d+)\b", text)}
        used |= {int(n) for n in re.findall(r"\breturn \d+ if .* else (\d+)\b", text)}
    used |= {0, 1, 2}  # Diagnosis.exit_code (preflight)
    assert used >= {0, 1, 64, 65, 73}
    assert used <= set(EXIT_CODES), used - set(EXIT_CODES)
