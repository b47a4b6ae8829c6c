"""ctypes access to the interposer's control API (csrc/capi/umbp_sim/interposer.h).

Used inside the child process that runs an external allocator: activate a kernel, mark the
allocator's objects and the threads inside an allocator call, read the counters.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from umbp_sim.capi import interposer_path, kernel_capsule

_STAT_FIELDS = ("routed", "faults", "moved", "resident", "mappings", "sim_fds")


class _Stats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_ulong) for name in _STAT_FIELDS]


@dataclass(frozen=True)
class InterposerStats:
    routed: int
    faults: int
    moved: int
    resident: int
    mappings: int
    sim_fds: int


class Interposer:
    """The loaded interposer library (the one LD_PRELOADed, or linked into a wrapped build)."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path or interposer_path()
        self.lib = ctypes.CDLL(self.path)
        lib = self.lib
        lib.umbp_sim_interposer_activate.argtypes = [ctypes.c_void_p]
        lib.umbp_sim_interposer_activate.restype = ctypes.c_int
        lib.umbp_sim_interposer_add_caller_object.argtypes = [ctypes.c_char_p]
        lib.umbp_sim_interposer_add_caller_object.restype = ctypes.c_int
        lib.umbp_sim_interposer_set_resident_limit.argtypes = [ctypes.c_size_t]
        lib.umbp_sim_interposer_get_stats.argtypes = [ctypes.POINTER(_Stats)]
        self._capsule: Any = None

    def activate(self, kernel: Any) -> None:
        """Route the allocator's calls to ``kernel`` (kept alive while active)."""
        capsule = kernel_capsule(kernel)
        get = ctypes.pythonapi.PyCapsule_GetPointer
        get.restype = ctypes.c_void_p
        get.argtypes = [ctypes.py_object, ctypes.c_char_p]
        ptr = get(capsule, b"umbp_sim.kernel")
        rc = self.lib.umbp_sim_interposer_activate(ptr)
        if rc != 0:
            raise OSError(rc, "umbp_sim_interposer_activate failed")
        self._capsule = capsule

    def deactivate(self) -> None:
        self.lib.umbp_sim_interposer_deactivate()
        self._capsule = None

    def add_caller_object(self, path: str) -> int:
        return int(self.lib.umbp_sim_interposer_add_caller_object(path.encode()))

    def set_resident_limit(self, nbytes: int) -> None:
        self.lib.umbp_sim_interposer_set_resident_limit(nbytes)

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        """Calls on this thread inside the block are the allocator's."""
        self.lib.umbp_sim_interposer_enter()
        try:
            yield
        finally:
            self.lib.umbp_sim_interposer_leave()

    def stats(self) -> InterposerStats:
        s = _Stats()
        self.lib.umbp_sim_interposer_get_stats(ctypes.byref(s))
        return InterposerStats(*(int(getattr(s, f)) for f in _STAT_FIELDS))
