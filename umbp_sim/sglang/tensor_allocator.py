"""sglang's HiCache ``UMBPHostTensorAllocator``, made safe to run many times in one process.

Emulates sglang 0.5.23's ``mem_cache/storage/umbp/umbp_host_allocator.py`` (:data:`RELEASE`):
same environment variables and parsing (``UMBP_STANDALONE_ADDRESS`` set: shared buffers,
AnonymousShmHugetlb / AnonymousShm), same ``alloc`` call, same RuntimeError and log texts, same
logger name. ``tests_sglang/test_sglang_release.py`` checks it against the real module when sglang
is installed (tox -e sglang). Two differences, both deliberate:

- ``close()`` and garbage collection free every handle, but never under a live tensor (0.5.23's
  ``__del__`` frees them all, also under tensors still in use): each tensor
  holds a reference to its mapping, which is freed when both the allocator has let go of it and
  the last tensor viewing it is gone;
- an unparsable environment value is an :class:`~umbp_sim.sglang.env.EnvVarError` naming the
  variable (sglang raises a bare ``int()`` ValueError; see ``env.sglang_env_failure``).

The mori-compatible module is umbp-sim's own by default (``umbp_sim.UMBPHostMemAllocator``);
pass ``module=`` to run on another one (the real ``mori.umbp``, a test double).
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import weakref
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

from umbp_sim.errors import UmbpSimError
from umbp_sim.sglang.env import STANDALONE, HostAllocEnv, parse_env

# sglang logs under its module's __name__; use the same name so log filters written for sglang
# see umbp-sim's messages.
LOGGER_NAME = "sglang.srt.mem_cache.storage.umbp.umbp_host_allocator"
logger = logging.getLogger(LOGGER_NAME)
notes = logging.getLogger("umbp_sim.sglang")

RELEASE = "0.5.23"
# 0.5.23's demotion warning; the backings are str() of mori's enum members.
DEMOTION_WARNING = (
    "UMBPHostTensorAllocator: requested %s backing but kernel "
    "demoted to %s (4 KiB pages). Check vm.nr_hugepages and "
    "HugePages_Free in /proc/meminfo. Performance and AINIC "
    "MR-size benefits will not apply."
)


class TorchMissingError(UmbpSimError, ImportError):
    """torch is not installed; an ImportError, which sglang's caller treats as 'fall back'."""


def alloc_failure_message(nbytes: int, requested_backing: object, numa_node: int) -> str:
    """sglang's RuntimeError text for a null handle (backing printed with str())."""
    return (
        f"UMBPHostMemAllocator.alloc({nbytes} bytes) failed "
        f"(requested_backing={requested_backing}, "
        f"numa_node={numa_node})."
    )


def _require_torch(what: str) -> ModuleType:
    try:
        import torch
    except ImportError:
        raise TorchMissingError(
            f"torch is required for {what} (install torch, e.g. pip install 'umbp-sim[torch]')"
        ) from None
    return torch


def _default_module() -> Any:
    import umbp_sim

    if not all(hasattr(umbp_sim, n) for n in ("UMBPHostMemAllocator", "UMBPHostBufferBacking")):
        raise RuntimeError(
            "umbp_sim has no UMBPHostMemAllocator: the native allocator module is not built"
        )
    return umbp_sim


def _free_handle(allocator: Any, handle: Any, errors: list[str]) -> None:
    # Runs from a finalizer: never raise, record and log instead.
    try:
        allocator.free(handle)
    except Exception as e:  # noqa: BLE001 - a finalizer must not raise
        msg = (
            f"UMBPHostMemAllocator.free(ptr=0x{int(handle.ptr):x}) failed: {type(e).__name__}: {e}"
        )
        errors.append(msg)
        logger.error("%s", msg)


class _Mapping:
    """One live handle. Freed (allocator.free) when this object dies.

    Referenced by the tensor allocator's list until close(), and by the ctypes buffer every
    tensor over the mapping keeps alive (torch.frombuffer holds the buffer object).
    """

    __slots__ = ("handle", "nbytes", "finalizer", "__weakref__")

    def __init__(self, allocator: Any, handle: Any, nbytes: int, errors: list[str]) -> None:
        self.handle = handle
        self.nbytes = nbytes
        self.finalizer = weakref.finalize(self, _free_handle, allocator, handle, errors)
        # At interpreter exit tensors may still be referenced; the process's end unmaps.
        self.finalizer.atexit = False


class UMBPHostTensorAllocator:
    """``allocate(dims, dtype, device="cpu")`` -> a torch tensor over a UMBP host buffer."""

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        *,
        module: Any = None,
    ) -> None:
        _require_torch("UMBPHostTensorAllocator")
        self._mod = _default_module() if module is None else module
        self._allocator = self._mod.UMBPHostMemAllocator()
        settings: HostAllocEnv = parse_env(env)
        self.settings = settings
        # Standalone mode needs fd-shareable backing (any non-empty value, as sglang reads it).
        self._standalone_process = bool((os.environ if env is None else env).get(STANDALONE))
        self._use_hugepage = settings.use_hugepage
        self._hugepage_size = settings.hugepage_size
        self._numa_node = settings.numa_node
        self._prefault = settings.prefault
        for w in settings.warnings:  # umbp-sim's note, not a line sglang logs
            notes.warning("%s", w)
        self.dims: tuple[int, ...] | None = None
        self.dtype: Any = None
        self.free_errors: list[str] = []
        self.demotions = 0  # allocations that asked for hugepages and got 4 KiB pages
        # Every mapping handed out and not yet released; weakly, every mapping not yet freed.
        self._owned: list[_Mapping] = []
        self._alive: weakref.WeakSet[_Mapping] = weakref.WeakSet()
        self._closed = False
        self._finalizer = weakref.finalize(self, list.clear, self._owned)

    @property
    def requested_backing(self) -> Any:
        b = self._mod.UMBPHostBufferBacking
        if self._standalone_process:
            return b.AnonymousShmHugetlb if self._use_hugepage else b.AnonymousShm
        return b.AnonymousHugetlb if self._use_hugepage else b.Anonymous

    @property
    def handles(self) -> tuple[Any, ...]:
        """Handles not yet freed: owned by this allocator or kept alive by a tensor."""
        return tuple(m.handle for m in self._alive)

    @property
    def owned_handles(self) -> tuple[Any, ...]:
        """Handles this allocator still owns (released by close())."""
        return tuple(m.handle for m in self._owned)

    def allocate(self, dims: Sequence[int], dtype: Any, device: str = "cpu") -> Any:
        torch = _require_torch("UMBPHostTensorAllocator.allocate")
        if self._closed:
            raise RuntimeError("UMBPHostTensorAllocator.allocate() called after close()")
        if device != "cpu":
            raise ValueError(
                f"UMBPHostTensorAllocator only supports CPU host memory, got device={device}"
            )
        self.dims = tuple(dims)
        self.dtype = dtype
        element_size = torch.empty((), dtype=dtype).element_size()
        nbytes = math.prod(int(d) for d in dims) * element_size
        requested_backing = self.requested_backing

        handle = self._allocator.alloc(
            nbytes,
            requested_backing,
            self._hugepage_size,
            self._numa_node,
            self._prefault,
        )
        if not handle:
            raise RuntimeError(alloc_failure_message(nbytes, requested_backing, self._numa_node))
        mapping = _Mapping(self._allocator, handle, nbytes, self.free_errors)
        self._owned.append(mapping)
        self._alive.add(mapping)

        # A ctypes array at the handle's address; the attribute ties the mapping's lifetime to
        # the buffer object, which torch.frombuffer keeps alive as long as any view exists.
        c_array = (ctypes.c_byte * nbytes).from_address(handle.ptr)
        c_array._umbp_mapping = mapping  # type: ignore[attr-defined]
        tensor = torch.frombuffer(c_array, dtype=torch.uint8, count=nbytes)
        if dtype != torch.uint8:
            tensor = tensor.view(dtype)

        logger.info(
            "UMBPHostTensorAllocator: allocated %.2f GB at 0x%x "
            "requested_backing=%s actual_backing=%s actual_alignment=%d "
            "mapped_size=%d numa_node=%d",
            nbytes / 1e9,
            handle.ptr,
            requested_backing,
            handle.actual_backing,
            handle.actual_alignment,
            handle.mapped_size,
            self._numa_node,
        )
        b = self._mod.UMBPHostBufferBacking
        demoted = handle.actual_backing == (
            b.AnonymousShm if self._standalone_process else b.Anonymous
        )
        if self._use_hugepage and demoted:
            self.demotions += 1
            logger.warning(DEMOTION_WARNING, requested_backing, handle.actual_backing)
        return tensor.view(tuple(dims))

    def close(self) -> None:
        """Release every mapping; one still viewed by a live tensor is freed with its last view."""
        self._closed = True
        self._finalizer()

    def __enter__(self) -> UMBPHostTensorAllocator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
