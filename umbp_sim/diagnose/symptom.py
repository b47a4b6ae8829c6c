"""What the server showed, as the replay's question: ``replay DUMP REQUEST --symptom SYMPTOM``.

Three symptoms are read (docs/symptoms.md), each by a word or by the line as it was logged:

- ``sigbus``: the process died of SIGBUS (``SIGBUS``, ``Bus error``, the shell's
  ``Bus error (core dumped)``, an exit status of 135);
- ``oom-kill``: the OOM killer killed it (``oom-kill``, ``OOMKilled``, the shell's ``Killed``,
  the kernel's ``Out of memory: Killed process ...`` / ``Memory cgroup out of memory`` lines,
  an exit status of 137);
- ``demoted``: the buffer fell back to base pages (``demoted``, sglang's
  ``requested ... backing but kernel demoted to ...`` warning, or an allocator's fallback line:
  mori's ``MAP_HUGETLB allocation failed ... falling back to anonymous pages``, umbp-sim's
  ``... falling back to 4 KiB pages``; matched against the warning catalogue,
  ``umbp_sim.vocabulary.warning_ids``).

Anything else is a one-line usage error listing these forms (exit 64). ``Symptom.seen(record)``
says whether a simulated run's record shows it: the replay's run (reproduced) or a hypothesis's
(``diagnose/hypotheses.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from umbp_sim.errors import UmbpSimError
from umbp_sim.vocabulary.bounded import shown
from umbp_sim.vocabulary.exit_codes import EX_USAGE

if TYPE_CHECKING:
    from umbp_sim.engine.record import RunRecord

KINDS = ("sigbus", "oom-kill", "demoted")
# What each symptom is, in a sentence's words.
SAID = {
    "sigbus": "the process died of SIGBUS (Bus error)",
    "oom-kill": "the process was OOM-killed (SIGKILL)",
    "demoted": "the buffer was demoted to base pages (the demotion warning)",
}
# The short name a hypothesis line ends with ("...: SIGBUS").
_SIGNAL = {"sigbus": "SIGBUS", "oom-kill": "SIGKILL"}
SHORT = {"sigbus": "SIGBUS", "oom-kill": "the OOM kill", "demoted": "the demotion"}

# The allocators' warnings that say a hugepage buffer fell back to base pages, by id
# (csrc/allocator/warning_texts.h).
DEMOTION_IDS = frozenset(
    {
        "hugepage-size-not-power-of-two",
        "hugepage-size-not-above-base-page",
        "hugetlb-fallback-memfd",
        "hugetlb-fallback-ftruncate",
        "hugetlb-fallback-mmap",
        "hugetlb-fallback-populate",
        "mori-hugetlb-fallback",
        "mori-invalid-hugepage-size",
        "mori-invalid-hugepage-size-shm",
    }
)

_WORDS = {
    "sigbus": "sigbus",
    "bus-error": "sigbus",
    "bus error": "sigbus",
    "buserror": "sigbus",
    "oom": "oom-kill",
    "oom-kill": "oom-kill",
    "oom-killed": "oom-kill",
    "oomkilled": "oom-kill",
    "oom kill": "oom-kill",
    "killed": "oom-kill",
    "demoted": "demoted",
    "demotion": "demoted",
}
_LINES = (
    ("sigbus", re.compile(r"\bbus error\b|\bsigbus\b|exit (?:code|status):? 135\b", re.I)),
    (
        "oom-kill",
        re.compile(
            r"out of memory: kill(?:ed)? process|memory cgroup out of memory|\boom-kill\b|"
            r"\boomkilled\b|invoked oom-killer|exit (?:code|status):? 137\b|(?:^|\s)Killed\s*$|"
            r"\b[0-9]+ Killed\s",
            re.I,
        ),
    ),
)
# sglang 0.5.23's warning (umbp_sim/sglang/tensor_allocator.py's DEMOTION_WARNING), its
# backings as str() prints them.
_SGLANG_DEMOTION = re.compile(r"requested \S+ backing but kernel demoted to \S+")

USAGE = (
    "give SIGBUS (or 'Bus error'), oom-kill (or 'Killed', the kernel's 'Out of memory: Killed "
    "process' line), demoted (or sglang's 'requested ... backing but kernel demoted to ...' "
    "line, mori's 'MAP_HUGETLB allocation failed ... falling back' line)"
)


class SymptomError(UmbpSimError):
    """``--symptom`` text that is no symptom umbp-sim reads."""

    exit_code = EX_USAGE


@dataclass(frozen=True)
class Symptom:
    kind: str  # one of KINDS
    text: str  # as given (a word, or the log line)

    @property
    def said(self) -> str:
        return SAID[self.kind]

    @property
    def short(self) -> str:
        return SHORT[self.kind]

    def seen(self, o: RunRecord) -> bool:
        """Whether a run's record ``o`` (any of its ranks) shows this symptom."""
        if self.kind == "demoted":  # any rank; or demoted, then killed
            return (
                o.outcome == "demoted"
                or any(e["outcome"] == "demoted" for e in o.ranks)
                or (_logged_demotion(o))
            )
        # A crashed rank ends the run and is its worst: the record's signal is that rank's.
        return o.outcome == "crashed" and o.signal == _SIGNAL[self.kind]

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "given": self.text, "means": self.said}


def _logged_demotion(o: RunRecord) -> bool:
    """A demotion warning in the run's log (a buffer demoted, then the process killed)."""
    return any(wid in DEMOTION_IDS for _, wid, _ in o.log)


def parse_symptom(text: str, where: str = "--symptom") -> Symptom:
    """The symptom ``text`` names or shows; SymptomError (one line, the forms) otherwise."""
    line = text.strip()
    word = re.sub(r"\s+", " ", line.lower())
    if word in _WORDS:
        return Symptom(_WORDS[word], line)
    if len(line) <= 64 << 10:  # a log line, not a whole log
        if _SGLANG_DEMOTION.search(line) or _demotion_warning(line):
            return Symptom("demoted", line)
        for kind, pattern in _LINES:
            if pattern.search(line):
                return Symptom(kind, line)
    raise SymptomError(f"{where} {shown(text)}: not a symptom umbp-sim reads; {USAGE}")


def _demotion_warning(line: str) -> bool:
    from umbp_sim.vocabulary.warning_ids import warning_id_in

    return warning_id_in(line, DEMOTION_IDS) is not None
