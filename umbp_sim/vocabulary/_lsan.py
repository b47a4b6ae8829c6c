"""Imports that LeakSanitizer should not track (only when it is preloaded: ``tox -e asan``).

numpy's import leaves 53 objects (3120 bytes of CPython tuples and capsules) that nothing
LeakSanitizer scans points to, and torch's one string: reported at exit as leaks of whichever
process imported them (the test process, the external allocator's server). They are not
umbp-sim's, so they are imported with LSan's tracking off for this thread (``__lsan_disable``);
every other allocation stays checked. Without LSan the symbol is absent: a plain import.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util


def lsan_active() -> bool:
    """Whether LeakSanitizer is loaded in this process."""
    return hasattr(ctypes.CDLL(None), "__lsan_disable")


def import_untracked(*names: str) -> None:
    """Import each installed module of ``names`` (a missing one is skipped)."""
    process = ctypes.CDLL(None)
    lsan = lsan_active()
    if lsan:
        process.__lsan_disable()
    try:
        for name in names:
            if importlib.util.find_spec(name) is not None:
                importlib.import_module(name)
    finally:
        if lsan:
            process.__lsan_enable()
