"""Dump notes carry codes (umbp_sim/dump/notes.py): every note the reader writes has one of the
declared codes beside its unchanged text, and explanations select notes by code."""

from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path

import pytest

from umbp_sim.diagnose.explain import NOTES_ALWAYS, NOTES_HUGEPAGES, NOTES_NUMA, _notes
from umbp_sim.diagnose.replay_request import Request
from umbp_sim.dump import load_dump
from umbp_sim.dump.notes import CODES, Note
from umbp_sim.machine import Machine
from umbp_sim.request import AllocRequest
from umbp_sim.sim import SimHost

ROOT = Path(__file__).resolve().parent.parent
DUMPS = sorted(
    [*(ROOT / "tests" / "data" / "machines").glob("*.tar.bz2"),
     *(p for p in (ROOT / "tests" / "data" / "replay").iterdir() if p.is_dir()),
     *(ROOT / "scenarios" / "dumps").glob("*.tar.bz2")]
)  # fmt: skip
REQUESTS = {
    "anonymous": Request(AllocRequest(1 << 30, "Anonymous")),
    "hugetlb": Request(AllocRequest(1 << 30, "AnonymousHugetlb")),
    "bound": Request(AllocRequest(1 << 30, "Anonymous", numa_node=0)),
}


def former_selection(notes: list[str], request: Request) -> list[str]:
    """The selection by words of the text this replaced (kept here only to show that the codes
    select the same notes on every bundled dump)."""
    keys = ["kernel version", "MemAvailable", "MemTotal add up", "is not modelled"]
    if request.wants_hugepages():
        keys += ["pages", "hugepage", "reserved"]
    if request.settings()[2] >= 0:
        keys.append("no NUMA information")
    return [n for n in notes if any(k in n for k in keys) and not n.startswith("page size")]


@pytest.mark.parametrize("dump", DUMPS, ids=lambda p: p.name)
def test_every_note_has_a_declared_code_and_the_selection_is_unchanged(dump: Path) -> None:
    _, facts = load_dump(dump)
    assert facts.notes and all(isinstance(n, Note) and n.code in CODES for n in facts.notes)
    for request in REQUESTS.values():
        chosen = [c.text.removeprefix("dump note: ") for c in _notes(facts, request)]
        assert chosen == former_selection(facts.notes, request)


def test_the_selected_codes_are_declared() -> None:
    assert NOTES_ALWAYS | NOTES_HUGEPAGES | NOTES_NUMA <= set(CODES)


def test_notes_are_selected_by_code_not_by_their_words() -> None:
    class Facts:
        notes = [
            Note("kernel-version-assumed", "text without the usual words"),
            Note("rlimit-as-unknown", "kernel version hugepage pages reserved MemAvailable"),
        ]

    for request in REQUESTS.values():
        chosen = [c.text for c in _notes(Facts(), request)]  # type: ignore[arg-type]
        assert chosen == ["dump note: text without the usual words"]


def test_a_note_is_its_text_and_keeps_its_code_through_copies() -> None:
    n = Note("no-hugetlb", "no hugepage sizes: kernel without CONFIG_HUGETLB_PAGE")
    assert n == "no hugepage sizes: kernel without CONFIG_HUGETLB_PAGE" and f"{n}" == str(n)
    for other in (copy.deepcopy(n), pickle.loads(pickle.dumps(n))):
        assert (other, other.code) == (n, "no-hugetlb")
    assert json.dumps([n]) == '["no hugepage sizes: kernel without CONFIG_HUGETLB_PAGE"]'
    with pytest.raises(ValueError, match="'no-such' is not a dump note code"):
        Note("no-such", "x")


def test_inspect_json_lists_the_codes_beside_the_texts(tmp_path: Path) -> None:
    SimHost(Machine.x86_64()).render(tmp_path / "h")
    _, facts = load_dump(tmp_path / "h")
    doc = json.loads(json.dumps(facts.to_json()))
    assert doc["notes"] == [str(n) for n in facts.notes]
    assert doc["note_codes"] == [n.code for n in facts.notes]


def test_a_dump_without_the_reserve_sysctls_says_it_took_the_defaults(tmp_path: Path) -> None:
    m = Machine.x86_64(admin_reserve_kbytes=0)
    SimHost(m).render(tmp_path / "h")
    (tmp_path / "h" / "proc" / "sys" / "vm" / "admin_reserve_kbytes").unlink()
    loaded, facts = load_dump(tmp_path / "h")
    assert loaded.admin_reserve_kbytes == 8192
    notes = [n for n in facts.notes if n.code == "reserve-default"]
    assert notes == ["admin_reserve_kbytes 8192: the kernel default (not in the dump)"]


def test_replay_json_gives_a_dump_notes_code_beside_its_cause() -> None:
    from umbp_sim.diagnose import diagnose

    machine, facts = load_dump(ROOT / "tests" / "data" / "machines" / "2i386-2c-nohugepage.tar.bz2")
    doc = diagnose(machine, facts, REQUESTS["anonymous"]).to_json()
    pairs = list(zip(doc["cause_sources"], doc["cause_note_codes"], doc["causes"], strict=True))
    dump = [(code, text) for source, code, text in pairs if source == "dump"]
    (guess,) = [n for n in facts.notes if n.code == "kernel-version-assumed"]
    assert ("kernel-version-assumed", f"dump note: {guess}") in dump
    assert all(code in NOTES_ALWAYS for code, _ in dump)
    assert all(code is None for source, code, _ in pairs if source != "dump")
