"""What the code's comments and the architecture documents cite exists: a repository path
(``umbp_sim/...``, ``csrc/...``, ``docs/...``, ``tests/...``, ``tools/...``, ``bench/...``) is a
file or folder of the checkout, and a dotted name ``umbp_sim.a.b`` is a module or an attribute
of one. A module moved or renamed leaves no comment pointing at where it was."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PATH = re.compile(r"(?<![\w./-])((?:umbp_sim|csrc|docs|tests|tools|bench|tests_sglang)/[\w./-]*\w)")
DOTTED = re.compile(r"(?<![\w./])(umbp_sim(?:\.[A-Za-z_]\w*)+)")
# Cited on purpose though not in the checkout, each with why.
NOT_FILES = {
    "umbp_sim/kernel.h": "the installed header's include path (csrc/capi/umbp_sim/kernel.h)",
    "umbp_sim/interposer.h": "the installed header's include path (csrc/capi/umbp_sim/)",
    "umbp_sim/_native": "the built extension's name, with the platform's suffix",
    "csrc/kernel/sim_": "the prefix of SimKernel's files (sim_*.cpp)",
    "tests/scenarios": "the example folder of a user's project (pytest_plugin's ini option)",
}
NOT_NAMES = {
    "umbp_sim.kernel": "the C ABI capsule's name (umbp_sim.capi.kernel_capsule)",
    "umbp_sim._native.FastMethod": "a type's printed name (tp_name); the type is not exported",
    "umbp_sim._native.FastBoundMethod": "a type's printed name (tp_name), not exported",
}


def _sources() -> list[Path]:
    found = [*(ROOT / "umbp_sim").rglob("*.py"), *(ROOT / "csrc").rglob("*.h")]
    found += [*(ROOT / "csrc").rglob("*.cpp"), ROOT / "ARCHITECTURE.md", ROOT / "docs/layout.md"]
    return sorted(found)


def _where(path: Path, text: str, start: int) -> str:
    return f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, start) + 1}"


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for attr in parts[k:]:
            if not hasattr(found, attr):
                return False
            found = getattr(found, attr)
        return True
    return False


def test_the_sources_are_read() -> None:
    assert len(_sources()) > 200


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # a deprecated alias still resolves
def test_every_cited_path_and_dotted_name_exists() -> None:
    missing = []
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        for m in PATH.finditer(text):
            cited = m.group(1).rstrip(".")
            if cited not in NOT_FILES and not (ROOT / cited).exists():
                missing.append(f"{_where(path, text, m.start())}: {cited}")
        for m in DOTTED.finditer(text):
            if m.group(1) not in NOT_NAMES and not _resolves(m.group(1)):
                missing.append(f"{_where(path, text, m.start())}: {m.group(1)}")
    assert missing == []


def test_a_stale_citation_is_found(tmp_path: Path) -> None:
    assert not _resolves("umbp_sim.external.compare") and _resolves("umbp_sim.comparison.matrix")
    assert _resolves("umbp_sim.comparison.matrix.quick") and not _resolves("umbp_sim.no_such")
    assert [m.group(1) for m in PATH.finditer("see ``umbp_sim/external/compare.py``.")] == [
        "umbp_sim/external/compare.py"
    ]
