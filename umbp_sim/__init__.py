"""umbp-sim: the UMBP host-memory allocator on an injectable kernel seam.

Drop-in for ``mori.umbp``: ``UMBPHostMemAllocator``, ``UMBPHostBufferBacking`` (and its values
as module attributes), ``UMBPHostBufferHandle``.
"""

from __future__ import annotations

import sys as _sys
from importlib import import_module as _import_module

# No `typing`, `pathlib` or `importlib.util` here: `umbp-sim --help` pays for every import.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any


def _missing_native(here: Path | None = None) -> str:
    """The one line that says what to do when the compiled extension cannot be imported
    (``here``: the package directory, by default this one)."""
    from pathlib import Path

    here = here or Path(__file__).resolve().parent
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


# The names below are imported on first use (PEP 562), so `import umbp_sim.cli` (and with it
# `umbp-sim --help`) loads neither the compiled extension nor the simulator. The extension's
# presence is still checked here, cheaply (a path lookup, no load), so a source tree without
# it fails at `import umbp_sim` with the one line above.
def _findable(name: str) -> bool:
    """Whether the submodule ``umbp_sim.<name>`` can be imported (found, not loaded): what
    ``importlib.util.find_spec`` does, through every finder (an editable install's too)."""
    for finder in _sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is not None and find_spec(f"umbp_sim.{name}", __path__) is not None:
            return True
    return False


if not _findable("_native"):
    raise ImportError(_missing_native(), name="umbp_sim._native")

# public name -> the submodule that defines it
_LAZY: dict[str, str] = {
    "Anonymous": "allocator",
    "AnonymousHugetlb": "allocator",
    "AnonymousShm": "allocator",
    "AnonymousShmHugetlb": "allocator",
    "UMBPHostBufferBacking": "allocator",
    "UMBPHostBufferHandle": "allocator",
    "UMBPHostMemAllocator": "allocator",
    "UMBPShmAllocation": "allocator",
    "get_include": "capi",
    "interposer_path": "capi",
    "HostGoneError": "errors",
    "SimulatedCrash": "errors",
    "UmbpSimError": "errors",
    "FaultPlan": "faults",
    "HugePool": "machine",
    "Machine": "machine",
    "Node": "machine",
    "HugePages": "sim",
    "Mapping": "sim",
    "SimHost": "sim",
    "simulate": "sim",
}

if TYPE_CHECKING:
    from umbp_sim import _native, mori_compat
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
    from umbp_sim.errors import HostGoneError, SimulatedCrash, UmbpSimError
    from umbp_sim.faults import FaultPlan
    from umbp_sim.machine import HugePool, Machine, Node
    from umbp_sim.sim import HugePages, Mapping, SimHost, simulate

    __version__: str


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("umbp-sim")
    except metadata.PackageNotFoundError:  # running from a source tree
        return "0.0.0"


def __getattr__(name: str) -> Any:
    """The public names, ``__version__`` and the submodules (``umbp_sim.mori_compat``), loaded
    on first use."""
    if name in _LAZY:
        value = getattr(_import_module(f"umbp_sim.{_LAZY[name]}"), name)
    elif name == "__version__":
        value = _version()
    elif not name.startswith("__") and _findable(name):
        value = _import_module(f"umbp_sim.{name}")
    else:
        raise AttributeError(f"module 'umbp_sim' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "Anonymous",
    "AnonymousHugetlb",
    "AnonymousShm",
    "AnonymousShmHugetlb",
    "FaultPlan",
    "HostGoneError",
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
