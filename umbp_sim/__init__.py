"""umbp-sim: the UMBP host-memory allocator on an injectable kernel seam.

Drop-in for ``mori.umbp``: ``UMBPHostMemAllocator``, ``UMBPHostBufferBacking`` (and its values
as module attributes), ``UMBPHostBufferHandle``.
"""

# ruff: noqa: E402 - the imports below need the extension check above them first

from importlib import metadata as _metadata
from pathlib import Path as _Path


def _missing_native(here: _Path | None = None) -> str:
    """The one line that says what to do when the compiled extension cannot be imported
    (``here``: the package directory, by default this one)."""
    here = here or _Path(__file__).resolve().parent
    if (here.parent / "pyproject.toml").is_file() and (here.parent / "csrc").is_dir():
        return (
            f"umbp_sim was imported from the source tree {here} (no compiled _native there): "
            "after `pip install .`, start Python outside the repository root or with "
            "`python -P` (PYTHONSAFEPATH=1)"
        )
    return (
        f"umbp_sim's compiled extension _native is missing from {here}: reinstall umbp-sim "
        "(`pip install --force-reinstall umbp-sim`; building it needs a C++17 compiler)"
    )


try:
    import umbp_sim._native as _native
except ModuleNotFoundError as _e:
    if _e.name != "umbp_sim._native":
        raise
    raise ImportError(_missing_native(), name="umbp_sim._native") from None

from umbp_sim import mori_compat
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
    "mori_compat",
]
