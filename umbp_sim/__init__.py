"""umbp-sim: the UMBP host-memory allocator on an injectable kernel seam.

Drop-in for ``mori.umbp``: ``UMBPHostMemAllocator``, ``UMBPHostBufferBacking`` (and its values
as module attributes), ``UMBPHostBufferHandle``.
"""

from importlib import metadata as _metadata

from umbp_sim import _native
from umbp_sim.allocator import (
    Anonymous,
    AnonymousHugetlb,
    AnonymousShm,
    AnonymousShmHugetlb,
    UMBPHostBufferBacking,
    UMBPHostBufferHandle,
    UMBPHostMemAllocator,
    UMBPShmAllocation,
)
from umbp_sim.errors import SimulatedCrash, UmbpSimError

try:
    __version__ = _metadata.version("umbp-sim")
except _metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0"

__all__ = [
    "Anonymous",
    "AnonymousHugetlb",
    "AnonymousShm",
    "AnonymousShmHugetlb",
    "SimulatedCrash",
    "UMBPHostBufferBacking",
    "UMBPHostBufferHandle",
    "UMBPHostMemAllocator",
    "UMBPShmAllocation",
    "UmbpSimError",
    "__version__",
    "_native",
]
