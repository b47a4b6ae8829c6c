"""The allocator's vocabulary, once: backing names, which of them are hugetlb or shared, what a
demotion is, and the outcome names every report uses.

``UMBPHostBufferBacking`` values are named as mori names them. A request for a hugetlb backing
that got 4 KiB pages is *demoted* (the allocator's fallback, not a failure): ``is_demoted``
decides it for every caller (scenario runner, reference model, real-kernel verification).
"""

from __future__ import annotations

BACKINGS = ("Anonymous", "AnonymousHugetlb", "AnonymousShm", "AnonymousShmHugetlb")
HUGETLB_BACKINGS = frozenset({"AnonymousHugetlb", "AnonymousShmHugetlb"})
SHM_BACKINGS = frozenset({"AnonymousShm", "AnonymousShmHugetlb"})
# What a hugetlb backing falls back to: the same sharing, 4 KiB pages.
DEMOTED_TO = {"AnonymousHugetlb": "Anonymous", "AnonymousShmHugetlb": "AnonymousShm"}
OUTCOMES = ("ok", "demoted", "failed", "crashed")


def is_demoted(requested: str, actual: str) -> bool:
    """Hugetlb pages were asked for and the buffer got 4 KiB pages.

    >>> is_demoted("AnonymousHugetlb", "Anonymous"), is_demoted("Anonymous", "Anonymous")
    (True, False)
    """
    return requested in HUGETLB_BACKINGS and actual not in HUGETLB_BACKINGS


def alloc_outcome(requested: str, actual: str) -> str:
    """The outcome of an allocation that returned a buffer: "demoted" or "ok"."""
    return "demoted" if is_demoted(requested, actual) else "ok"
