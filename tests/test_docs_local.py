"""The repository's knowledge is in the repository: every document a tracked file cites is under
docs/, and every section or row it cites exists there.

Reads tracked files as text only (no umbp_sim import), so it runs in a bare checkout.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Documents that live outside a clone; built from pieces so that this file does not name them.
_OUTSIDE = ("..", "/", "shared")
FORBIDDEN = (
    "".join(_OUTSIDE),
    *("shared/" + name for name in ("kernel-model", "deployed-behaviour", "field-failures")),
    "DESIGN" + ".md",
)

# "docs/kernel-model.md section 3", "kernel-model.md sections 1-2", "kernel-model.md 4 and 6:",
# "kernel-model.md 1 step 2", "kernel-model.md sections 0-2, 4, 5": the numbers cited.
_NUMBER = r"\d+(?:\s+step\s+\d+)?"
_SECTION_CITE = re.compile(
    r"kernel-model\.md,?\s+(?:sections?\s+)?"
    rf"({_NUMBER}(?:\s*(?:,\s*(?:and\s+)?|-|–|\s+and\s+)\s*{_NUMBER})*)"
)
# "deployed-behaviour.md row 4", "deployed-behaviour.md, row 4", "rows 7 and 8".
_ROW_CITE = re.compile(r"deployed-behaviour\.md,?\s+rows?\s+(\d+(?:\s*(?:,|-|and)\s*\d+)*)")
_DOC_NAME = re.compile(r"\bdocs/([A-Za-z0-9_.-]+\.md)\b")


@cache
def tracked_texts() -> dict[str, str]:
    """path -> text of every tracked file that is text (binary files are left out)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the tracked files cannot be listed")
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=False
    )
    if proc.returncode != 0:
        pytest.skip(f"{ROOT} is not a git checkout: {proc.stderr.decode(errors='replace').strip()}")
    texts = {}
    for rel in proc.stdout.decode().split("\0"):
        path = ROOT / rel
        if not rel or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue
        texts[rel] = data.decode("utf-8", errors="replace")
    return texts


def cited_numbers(spec: str) -> set[int]:
    """'1-2' -> {1, 2}; '0-2, 4, 5' -> {0, 1, 2, 4, 5}; '1 step 4 and 6' -> {1, 6}."""
    spec = re.sub(r"\s+step\s+\d+", "", spec)
    out: set[int] = set()
    for part in re.split(r"\s*(?:,|\band\b)\s*", spec):
        m = re.fullmatch(r"(\d+)(?:\s*[-–]\s*(\d+))?", part.strip())
        if m:
            lo = int(m.group(1))
            out.update(range(lo, int(m.group(2) or lo) + 1))
    return out


def kernel_model_sections() -> set[int]:
    text = (ROOT / "docs" / "kernel-model.md").read_text()
    return {int(n) for n in re.findall(r"^## (\d+)\. ", text, re.MULTILINE)}


def deployed_behaviour_rows() -> set[int]:
    text = (ROOT / "docs" / "deployed-behaviour.md").read_text()
    return {int(n) for n in re.findall(r"^\| (\d+) \|", text, re.MULTILINE)}


def test_no_file_cites_documents_outside_the_repository() -> None:
    hits = [
        f"{rel}:{n}: {word!r}"
        for rel, text in tracked_texts().items()
        for n, line in enumerate(text.splitlines(), 1)
        for word in FORBIDDEN
        if word in line
    ]
    assert not hits, "cites a document a clone does not have:\n" + "\n".join(hits)


def test_every_cited_docs_file_exists() -> None:
    missing = sorted(
        f"{rel}: docs/{name}"
        for rel, text in tracked_texts().items()
        for name in set(_DOC_NAME.findall(text))
        if not (ROOT / "docs" / name).is_file()
    )
    assert not missing, "names a docs/ file that is not in the repository:\n" + "\n".join(missing)


def test_every_cited_kernel_model_section_exists() -> None:
    texts = tracked_texts()
    sections = kernel_model_sections()
    assert sections == set(range(10)), sections
    bad = []
    cites = 0
    for rel, text in texts.items():
        for m in _SECTION_CITE.finditer(text):
            cites += 1
            for n in cited_numbers(m.group(1)) - sections:
                bad.append(f"{rel}: {m.group(0)!r} (no section {n})")
    assert cites >= 20, f"only {cites} citations found: the pattern no longer matches them"
    assert not bad, "cites a section docs/kernel-model.md does not have:\n" + "\n".join(bad)


def test_every_cited_deployed_behaviour_row_exists() -> None:
    texts = tracked_texts()
    rows = deployed_behaviour_rows()
    assert rows == set(range(1, 11)), rows
    bad = [
        f"{rel}: {m.group(0)!r} (no row {n})"
        for rel, text in texts.items()
        for m in _ROW_CITE.finditer(text)
        for n in cited_numbers(m.group(1)) - rows
    ]
    assert not bad, "cites a row docs/deployed-behaviour.md does not have:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    ("spec", "numbers"),
    [
        ("3", {3}),
        ("1-2", {1, 2}),
        ("4-6, 9", {4, 5, 6, 9}),
        ("0-2, 4, 5", {0, 1, 2, 4, 5}),
        ("1 step 4 and 6", {1, 6}),
        ("2, 3 and 5", {2, 3, 5}),
        ("1, 2, 6", {1, 2, 6}),
    ],
)
def test_cited_numbers(spec: str, numbers: set[int]) -> None:
    assert cited_numbers(spec) == numbers


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ('source = "docs/kernel-model.md 1 step 2: surplus"', "1 step 2"),
        ("(docs/kernel-model.md sections 0-2, 4, 5) and the", "0-2, 4, 5"),
        ("docs/kernel-model.md 1 step 4 and 6: hugetlb", "1 step 4 and 6"),
        ("docs/kernel-model.md section 3: x", "3"),
        ("(docs/kernel-model.md sections 1-4, 6). Faults", "1-4, 6"),
        ('docs/kernel-model.md 3 and 4"', "3 and 4"),
    ],
)
def test_section_pattern(text: str, spec: str) -> None:
    m = _SECTION_CITE.search(text)
    assert m and m.group(1) == spec
