"""Which kernel new allocators stand on: the real one, or this thread's innermost ``simulate()``
host.

Per thread: an allocator created on a thread inside a ``with umbp_sim.simulate(...)`` block
stands on that block's host; on every other thread (threads started inside the block
included) it stands on the real kernel, unless given ``kernel=host.kernel``. Leaving a block
removes its host from its thread's stack whatever the order, so nothing is left behind on any
thread. A child made by ``fork()`` inside a block is inside it too (it is the same thread).
"""

from __future__ import annotations

import threading
from typing import Any

_local = threading.local()


def _stack() -> list[Any]:
    stack: list[Any] | None = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def push_kernel(kernel: Any) -> None:
    _stack().append(kernel)


def pop_kernel(kernel: Any) -> None:
    stack = _stack()
    for i in range(len(stack) - 1, -1, -1):
        if stack[i] is kernel:
            del stack[i]
            return
    raise RuntimeError(
        "umbp_sim: leaving a simulated host that is not active on this thread (a simulate() "
        "block must be left on the thread that entered it)"
    )


def current_kernel() -> Any | None:
    """The kernel of this thread's innermost active simulated host, or None for the real one."""
    stack = _stack()
    return stack[-1] if stack else None
