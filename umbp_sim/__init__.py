"""umbp-sim: the UMBP host-memory allocator on an injectable kernel seam."""

from umbp_sim import _native

__all__ = ["_native"]
