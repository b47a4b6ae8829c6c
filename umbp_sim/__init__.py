"""umbp-sim: the UMBP host-memory allocator on an injectable kernel seam.

Drop-in for ``mori.umbp``: ``UMBPHostMemAllocator``, ``UMBPHostBufferBacking`` (and its values
as module attributes), ``UMBPHostBufferHandle``.
"""

from importlib import metadata as _metadata

import umbp_sim._native as _native
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
from umbp_sim.capi import get_include, interposer_path
from umbp_sim.errors import SimulatedCrash, UmbpSimError
from umbp_sim.faults import FaultPlan
from umbp_sim.machine import HugePool, Machine, Node
from umbp_sim.sim import HugePages, Mapping, SimHost, simulate

try:
    __version__ = _metadata.version("umbp-sim")
except _metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0"

__all__ = [
    "Anonymous",
    "AnonymousHugetlb",
    "AnonymousShm",
    "AnonymousShmHugetlb",
    "FaultPlan",
    "HugePages",
    "HugePool",
    "Machine",
    "Mapping",
    "Node",
    "SimHost",
    "SimulatedCrash",
    "UMBPHostBufferBacking",
    "UMBPHostBufferHandle",
    "UMBPHostMemAllocator",
    "UMBPShmAllocation",
    "UmbpSimError",
    "get_include",
    "interposer_path",
    "simulate",
    "__version__",
    "_native",
]
