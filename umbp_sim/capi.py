"""The C ABI to umbp-sim's kernels: headers, the capsule, the interposer library.

``get_include()`` is the directory to pass as ``-I`` (``#include <umbp_sim/kernel.h>``);
``kernel_capsule(kernel)`` hands any ``umbp_sim._native.Kernel`` (Linux, Sim, Faulty, Tracing or a
stack of them) to C as a ``PyCapsule`` named ``umbp_sim.kernel`` holding a ``umbp_sim_kernel*``;
``interposer_path()`` is ``libumbp_sim_interpose.so`` (LD_PRELOAD it, or link against it with
``umbp-sim build-allocator``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from umbp_sim import _native

__all__ = ["get_include", "interposer_path", "kernel_capsule", "kernel_from_capsule"]

# The compiled files (the extension, the interposer, the headers) are installed together; in an
# editable install they sit in site-packages while this module is read from the source tree, so
# they are found beside the extension, not beside this file.
_INSTALLED = Path(_native.__file__).resolve().parent


def get_include() -> str:
    """The directory holding ``umbp_sim/kernel.h`` and ``umbp_sim/interposer.h``."""
    return str(_INSTALLED / "include")


def interposer_path() -> str:
    """Absolute path of the interposer shared object shipped in the wheel."""
    return str(_INSTALLED / "lib" / "libumbp_sim_interpose.so")


def kernel_capsule(kernel: Any) -> Any:
    """A capsule ``umbp_sim.kernel`` owning a reference to ``kernel`` (C: umbp_sim_kernel*)."""
    if not isinstance(kernel, _native.Kernel):
        raise TypeError(f"kernel must be a umbp_sim._native.Kernel, got {type(kernel).__name__}")
    return _native.kernel_capsule(kernel)


def kernel_from_capsule(capsule: Any) -> Any:
    """The kernel inside a capsule made by :func:`kernel_capsule`."""
    return _native.kernel_from_capsule(capsule)
