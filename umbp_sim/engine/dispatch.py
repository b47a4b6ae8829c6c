"""Deprecated: the router moved above the engine, to :mod:`umbp_sim.run_router` (the engine
imports nothing of it, nor of ``umbp_sim.external``)."""

from __future__ import annotations

import warnings

from umbp_sim.run_router import (
    BuiltinAllocator as BuiltinAllocator,
    ExternalAllocator as ExternalAllocator,
    OpenedAllocator as OpenedAllocator,
    open_allocator as open_allocator,
    run as run,
)

warnings.warn(
    "umbp_sim.engine.dispatch is deprecated: use umbp_sim.run_router", DeprecationWarning, 2
)

__all__ = ["BuiltinAllocator", "ExternalAllocator", "OpenedAllocator", "open_allocator", "run"]
