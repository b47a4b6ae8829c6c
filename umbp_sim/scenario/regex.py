"""``[expect].error_regex``: a pattern that is refused when it can backtrack exponentially, and
a match bounded in CPU time.

Python's ``re`` backtracks: ``(a+)+$`` against 40 characters runs for minutes. Two rules keep a
scenario's pattern bounded:

- **When the file is read** (:func:`pattern_problem`): no quantifier inside a repeated group
  (``(a+)+``, ``(.*a){20}``, ``(?:x*y)*``) and no alternation inside one (``(a|ab)*``): the
  patterns whose work grows exponentially with the text. A pattern is at most 1,000 characters.
- **When it is matched** (:func:`bounded_search`): at most ``MATCH_CPU_SECONDS`` of CPU; past
  that the scenario is refused (``RegexTimeout``) instead of hanging. This catches the
  polynomial cases the first rule lets through (``.*.*.*Z`` is n^4 on an n-character error).
  The bound needs the main thread (a CPU timer's signal); elsewhere the match runs unbounded.
"""

from __future__ import annotations

import re
import signal
import sys
import threading
from typing import Any

if sys.version_info >= (3, 11):
    from re import _constants as sre_constants, _parser as sre_parse
else:  # pragma: no cover - Python 3.10
    import sre_constants
    import sre_parse

MAX_PATTERN = 1000
MATCH_CPU_SECONDS = 1.0

_REPEATS = {sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT}
if hasattr(sre_constants, "POSSESSIVE_REPEAT"):
    _REPEATS.add(sre_constants.POSSESSIVE_REPEAT)


class RegexTimeout(Exception):
    """The match ran past its CPU bound."""


def pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` is refused (a sentence), or None. ``pattern`` is a string."""
    if len(pattern) > MAX_PATTERN:
        return f"{len(pattern):,} characters; at most {MAX_PATTERN:,}"
    try:
        tree = sre_parse.parse(pattern)
    except re.error as e:
        return f"not a valid regex: {e}"
    except (RecursionError, OverflowError, ValueError) as e:  # nesting or numbers beyond re's
        return f"not a valid regex: {type(e).__name__}"
    found = _nested(tree, repeated=False)
    if found is not None:
        return (
            f"{found} inside a repeated group can backtrack without bound (rewrite it without "
            "the outer repeat, e.g. 'a+' for '(a+)+')"
        )
    return None


def _nested(items: Any, repeated: bool) -> str | None:
    """The first quantifier or alternation found inside a repeat, as a phrase; None if none."""
    for op, av in items:
        if op in _REPEATS:
            lo, hi, body = av
            if repeated and hi != 1:
                return "a quantifier"
            found = _nested(body, repeated or hi != 1)
            if found is not None:
                return found
        elif op is sre_constants.BRANCH:
            if repeated:
                return "an alternation (|)"
            for branch in av[1]:
                found = _nested(branch, repeated)
                if found is not None:
                    return found
        else:
            for sub in _subpatterns(op, av):
                found = _nested(sub, repeated)
                if found is not None:
                    return found
    return None


def _subpatterns(op: Any, av: Any) -> list[Any]:
    if op is sre_constants.SUBPATTERN:
        return [av[-1]]
    if op in (sre_constants.ASSERT, sre_constants.ASSERT_NOT):
        return [av[1]]
    if op is sre_constants.GROUPREF_EXISTS:
        return [p for p in av[1:] if p is not None]
    if getattr(sre_constants, "ATOMIC_GROUP", None) is op:
        return [av]
    return []


def bounded_search(pattern: str, text: str, seconds: float = MATCH_CPU_SECONDS) -> bool:
    """``re.search(pattern, text) is not None`` within ``seconds`` of CPU (main thread), else
    RegexTimeout."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(
        signal, "setitimer"
    ):
        return re.search(pattern, text) is not None

    def expired(signum: int, frame: Any) -> None:
        raise RegexTimeout

    previous = signal.signal(signal.SIGVTALRM, expired)
    old_timer = signal.setitimer(signal.ITIMER_VIRTUAL, seconds)
    try:
        return re.search(pattern, text) is not None
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, *old_timer)
        signal.signal(signal.SIGVTALRM, previous)
