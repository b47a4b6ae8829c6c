"""Which kernel new allocators stand on: the real one, or the innermost ``simulate()`` host.

A process-wide stack (not a contextvar) so that allocators created on any thread inside a
``with umbp_sim.simulate(...)`` block land on the simulated host.
"""

from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()
_stack: list[Any] = []


def push_kernel(kernel: Any) -> None:
    with _lock:
        _stack.append(kernel)


def pop_kernel(kernel: Any) -> None:
    with _lock:
        if not _stack or _stack[-1] is not kernel:
            raise RuntimeError("umbp_sim: simulated hosts must be exited in the order entered")
        _stack.pop()


def current_kernel() -> Any | None:
    """The kernel of the innermost active simulated host, or None for the real kernel."""
    with _lock:
        return _stack[-1] if _stack else None
