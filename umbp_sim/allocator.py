"""mori.umbp's allocator surface on umbp-sim's kernel seam.

``UMBPHostMemAllocator`` is a drop-in for ``mori.umbp.UMBPHostMemAllocator``: same methods,
argument names and defaults. It runs on the kernel of the innermost ``umbp_sim.simulate(...)``
host active on the thread that creates it, else on the real kernel, or on the kernel passed
explicitly.

A handle's address (``ptr``) of a simulated buffer is the simulated host's memory: once the host
is gone (its SimHost, allocators and traced wrappers all dropped), ``ptr`` raises
``umbp_sim.errors.HostGoneError``. ``fork()`` is safe while other threads allocate: it waits for
the native calls in flight, and the child can allocate.

``profile`` chooses the built-in allocator (``umbp_sim.allocator_profiles``): ``"umbp-sim"``
(default here: mori plus umbp-sim's fixes) or ``"mori-624002c"`` (alias ``"mori"``: the model of
what mori's allocator does in the field).
:class:`MoriUMBPHostMemAllocator` is the mori profile with mori's Python binding as well (its
argument conversions, no shm registry methods): what ``umbp_sim.mori_compat`` installs as
``mori.umbp``.

Native warnings are gathered during the call (GIL released) and logged afterwards on the calling
thread to the ``umbp_sim.allocator`` logger, each record with its stable id as the attribute
``warning_id`` (csrc/allocator/warning_texts.h; mori's own texts under the mori profile; whether
mori's log level would show them is ``umbp_sim.allocator_profiles.mori_log_lines``). A simulated
fatal signal raises ``umbp_sim.errors.SimulatedCrash``.
"""

from __future__ import annotations

import logging
import operator
import os
import signal as _signal
import threading
from typing import Any

import umbp_sim._native as _native
from umbp_sim import _context
from umbp_sim.allocator_profiles import FIELD_PROFILE, FIXED_PROFILE, canonical_profile
from umbp_sim.errors import SimulatedCrash

logger = logging.getLogger("umbp_sim.allocator")

UMBPHostBufferBacking = _native.UMBPHostBufferBacking
UMBPHostBufferHandle = _native.UMBPHostBufferHandle
UMBPShmAllocation = _native.UMBPShmAllocation
Anonymous = UMBPHostBufferBacking.Anonymous
AnonymousHugetlb = UMBPHostBufferBacking.AnonymousHugetlb
AnonymousShm = UMBPHostBufferBacking.AnonymousShm
AnonymousShmHugetlb = UMBPHostBufferBacking.AnonymousShmHugetlb

# Each profile's native allocator (csrc/allocator).
_BUILTIN = {
    FIXED_PROFILE: _native.UmbpSimAllocator,
    FIELD_PROFILE: _native.Mori624002cAllocator,
}

_SIZE_MAX = 2**64 - 1
_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1

_real_kernel: Any = None
_real_kernel_lock = threading.Lock()


def _new_lock_in_child() -> None:
    # A thread of the parent may have held it at fork(): the child's copy would stay taken.
    global _real_kernel_lock
    _real_kernel_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_in_child)


def real_kernel() -> Any:
    """The process-wide LinuxKernel (one real process, one set of once-only warnings)."""
    global _real_kernel
    with _real_kernel_lock:
        if _real_kernel is None:
            _real_kernel = _native.LinuxKernel()
        return _real_kernel


def _int_arg(name: str, value: Any, lo: int, hi: int) -> int:
    # bool is an int subclass; True as a size is always a mistake.
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    v = operator.index(value)
    if v < lo:
        if lo == 0:
            raise ValueError(f"{name} must not be negative, got {v}")
        raise ValueError(f"{name} must be >= {lo}, got {v}")
    if v > hi:
        raise ValueError(f"{name} is out of range (max {hi}), got {v}")
    return v


def _signal_name(sig: Any) -> str:
    if isinstance(sig, str):
        return sig
    try:
        return _signal.Signals(int(sig)).name
    except (ValueError, TypeError):
        return f"signal {sig}"


class UMBPHostMemAllocator:
    """Host buffers (anonymous, hugetlb, memfd-backed), NUMA binding and prefault.

    ``profile`` defaults to ``"umbp-sim"``: umbp-sim's own allocator (mori with its fixes), the
    one an allocator change is written against. The command line's replay, preflight and run
    default to what the field runs, ``"mori-624002c"``; pass ``profile="mori"`` (or use
    ``umbp_sim.mori_compat.mori_umbp()``) for that here. ``umbp-sim profiles`` lists where
    the two differ.
    """

    def __init__(self, kernel: Any = None, profile: str = FIXED_PROFILE) -> None:
        if not isinstance(profile, str):
            raise TypeError(f"profile must be a str, got {type(profile).__name__} {profile!r}")
        if kernel is None:
            kernel = _context.current_kernel()
        if kernel is None:
            kernel = real_kernel()
        if not isinstance(kernel, _native.Kernel):
            raise TypeError(
                f"kernel must be a umbp_sim._native.Kernel or None, got {type(kernel).__name__}"
            )
        self._profile = canonical_profile(profile)  # ProfileError (a ValueError) if unknown
        self._kernel = kernel
        self._native = _BUILTIN[self._profile](kernel)

    @property
    def kernel(self) -> Any:
        """The kernel this allocator stands on."""
        return self._kernel

    @property
    def profile(self) -> str:
        """The allocator profile: ``"umbp-sim"`` or ``"mori-624002c"``."""
        return self._profile

    def alloc(
        self,
        size: int,
        backing: Any = Anonymous,
        hugepage_size: int = 2097152,
        numa_node: int = -1,
        prefault: bool = True,
    ) -> Any:
        """A UMBPHostBufferHandle; falsy when the allocation failed (see the logged warnings)."""
        # Plain calls read from an instance never get here (bind_fast_calls.cpp): this is the
        # path of every other call, checked and converted.
        n, b, hp, node, pf = self._alloc_args(size, backing, hugepage_size, numa_node, prefault)
        return self._native.alloc(n, b, hp, max(node, -1), pf)

    def _alloc_args(
        self, size: Any, backing: Any, hugepage_size: Any, numa_node: Any, prefault: Any
    ) -> tuple[int, Any, int, int, bool]:
        # Strict: wrong types are TypeError, out-of-range values ValueError, naming the argument.
        n = _int_arg("size", size, 0, _SIZE_MAX)
        if not isinstance(backing, UMBPHostBufferBacking):
            raise TypeError(
                f"backing must be a UMBPHostBufferBacking, got {type(backing).__name__} {backing!r}"
            )
        hp = _int_arg("hugepage_size", hugepage_size, 0, _SIZE_MAX)
        node = _int_arg("numa_node", numa_node, _INT_MIN, _INT_MAX)
        if not isinstance(prefault, (bool, int)) or prefault not in (0, 1):
            raise TypeError(f"prefault must be a bool, got {type(prefault).__name__} {prefault!r}")
        return n, backing, hp, node, bool(prefault)

    def free(self, handle: Any) -> None:
        """Unmap the buffer and invalidate the handle in place; freeing twice is a no-op."""
        if not isinstance(handle, UMBPHostBufferHandle):
            raise TypeError(
                f"handle must be a UMBPHostBufferHandle, got {type(handle).__name__} {handle!r}"
            )
        self._native.free(handle)

    # Read from an instance, alloc and free send plain calls (exact ints in range, a backing, a
    # bool; a handle) straight to the native allocator (csrc/python/bind_fast_calls.cpp), the
    # rest to the methods above; read from the class they are those methods.
    alloc = _native.fast_method(alloc, "alloc")
    free = _native.fast_method(free, "free")

    def lookup_shm_allocation(self, ptr: int, size: int) -> Any:
        """The live shm allocation containing [ptr, ptr + size), or None."""
        p = _int_arg("ptr", ptr, 0, _SIZE_MAX)
        n = _int_arg("size", size, 0, _SIZE_MAX)
        return self._native.lookup_shm_allocation(p, n)

    def acquire_shm_allocation(self, ptr: int, size: int) -> Any:
        """Like lookup, and holds the allocation: free defers munmap until the last release."""
        p = _int_arg("ptr", ptr, 0, _SIZE_MAX)
        n = _int_arg("size", size, 0, _SIZE_MAX)
        return self._native.acquire_shm_allocation(p, n)

    def release_shm_allocation(self, base: int) -> None:
        """Drop one hold on the allocation based at ``base``."""
        b = _int_arg("base", base, 0, _SIZE_MAX)
        self._native.release_shm_allocation(b)

    def snapshot(self) -> dict[str, list[dict[str, Any]]]:
        """The allocator's own bookkeeping on this kernel (all allocators on it): live buffers
        and shm registry records. What the process holds at the kernel (mappings, fds) is the
        traced kernel's ledger (``umbp_sim.host.leaks``).

        ``{"live": [{ptr, requested_size, mapped_size, backing, alignment, fd, numa_node}],
        "shm": [{base, mapped_size, fd, active_registrations, pending_free}]}``
        """
        return {"live": self._native.live_buffers(), "shm": self._native.shm_registry()}


def _report(native: Any, messages: list[tuple[str, str, str]], sig: int, where: str) -> None:
    """The outcome hook of the native allocators: a call's warnings as log records, and its
    simulated crash as SimulatedCrash (with what the kernel recorded of it)."""
    for level, warning_id, text in messages:
        extra = {"warning_id": warning_id}
        if level == "warning":
            logger.warning(text, extra=extra)
        else:
            logger.info(text, extra=extra)
    if sig:
        info = None
        crash_info = getattr(native.kernel, "crash_info", None)
        if callable(crash_info):
            info = crash_info()
        if info:  # SimKernel's record: its declared fields (_native.CRASH_FIELDS)
            raise SimulatedCrash(**info)
        raise SimulatedCrash(_signal_name(sig), where)


_native.set_outcome_hook(_report)


def _pybind_int(name: str, value: Any, lo: int, hi: int) -> int:
    # pybind11's integer caster: anything with __index__ (bool included: True is 1), no floats;
    # out of range is a failed conversion, i.e. TypeError.
    if isinstance(value, float) or not hasattr(type(value), "__index__"):
        raise TypeError(f"alloc(): incompatible function arguments ({name}={value!r})")
    v = operator.index(value)
    if not lo <= v <= hi:
        raise TypeError(f"alloc(): incompatible function arguments ({name}={value!r})")
    return v


def _pybind_bool(value: Any) -> bool:
    # pybind11's bool caster (convert mode): None is False, else the object's truth value.
    if value is None:
        return False
    if isinstance(value, (bool, int)) or hasattr(type(value), "__bool__"):
        return bool(value)
    raise TypeError(f"alloc(): incompatible function arguments (prefault={value!r})")


class MoriUMBPHostMemAllocator(UMBPHostMemAllocator):
    """mori's ``UMBPHostMemAllocator`` as its Python module has it (ROCm/mori 624002c).

    The mori-624002c allocator profile, mori's argument conversions (``size=True`` is 1,
    ``prefault=None`` is False, out-of-range integers are TypeError) and only ``alloc`` and
    ``free``: the shm registry is C++-only in mori.
    """

    def __init__(self, kernel: Any = None, profile: str = FIELD_PROFILE) -> None:
        super().__init__(kernel, profile)

    def _alloc_args(
        self, size: Any, backing: Any, hugepage_size: Any, numa_node: Any, prefault: Any
    ) -> tuple[int, Any, int, int, bool]:
        n = _pybind_int("size", size, 0, _SIZE_MAX)
        if not isinstance(backing, UMBPHostBufferBacking):
            raise TypeError(f"alloc(): incompatible function arguments (backing={backing!r})")
        hp = _pybind_int("hugepage_size", hugepage_size, 0, _SIZE_MAX)
        node = _pybind_int("numa_node", numa_node, _INT_MIN, _INT_MAX)
        return n, backing, hp, node, _pybind_bool(prefault)

    def __getattribute__(self, name: str) -> Any:
        if name in _REGISTRY_METHODS:
            raise AttributeError(
                f"'UMBPHostMemAllocator' object has no attribute '{name}' (mori's Python module "
                "has no shm registry methods)"
            )
        return super().__getattribute__(name)


_REGISTRY_METHODS = frozenset(
    {"lookup_shm_allocation", "acquire_shm_allocation", "release_shm_allocation"}
)


def allocator_class(profile: str) -> type[UMBPHostMemAllocator]:
    """The Python surface of a profile: mori's binding for mori's allocator, else umbp-sim's."""
    return (
        MoriUMBPHostMemAllocator
        if canonical_profile(profile) == FIELD_PROFILE
        else UMBPHostMemAllocator
    )
