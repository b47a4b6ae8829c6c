"""ctypes access to the interposer's control API (csrc/capi/umbp_sim/interposer.h).

Used inside the child process that runs an external allocator: activate a kernel, mark the
allocator's objects and the threads inside an allocator call, give it the fd for a simulated
death's evidence, read the counters.

Page touches of simulated mappings reach the Kernel by one of two fault paths: ``uffd``
(userfaultfd, a resolver thread) where the host allows it, else ``sigsegv`` (PROT_NONE and a
SIGSEGV handler). ``UMBP_SIM_FAULT_PATH=uffd|sigsegv|auto`` (or ``activate(fault_path=...)``)
chooses; ``Interposer.fault_path()`` says which one is active.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from umbp_sim.capi import interposer_path, kernel_capsule
from umbp_sim.errors import UmbpSimError

FAULT_PATH_ENV = "UMBP_SIM_FAULT_PATH"
_PATHS = {"auto": 0, "sigsegv": 1, "uffd": 2}
_ACTIVE = {0: None, 1: "sigsegv", 2: "uffd"}

_STAT_FIELDS = ("routed", "faults", "moved", "resident", "mappings", "sim_fds")


class _Stats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_ulong) for name in _STAT_FIELDS]


class FaultPathError(UmbpSimError):
    """The fault path asked for (UMBP_SIM_FAULT_PATH) cannot be used here."""


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
        lib.umbp_sim_interposer_get_stats.argtypes = [ctypes.POINTER(_Stats)]
        lib.umbp_sim_interposer_set_fault_path.argtypes = [ctypes.c_int]
        lib.umbp_sim_interposer_set_fault_path.restype = ctypes.c_int
        lib.umbp_sim_interposer_fault_path.restype = ctypes.c_int
        lib.umbp_sim_interposer_uffd_unavailable.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        lib.umbp_sim_interposer_uffd_unavailable.restype = ctypes.c_size_t
        lib.umbp_sim_interposer_set_evidence_fd.argtypes = [ctypes.c_int]
        lib.umbp_sim_interposer_set_evidence_fd.restype = ctypes.c_int
        self._capsule: Any = None

    def uffd_unavailable(self) -> str:
        """Why userfaultfd does not work in this process ("" when it does)."""
        buf = ctypes.create_string_buffer(512)
        self.lib.umbp_sim_interposer_uffd_unavailable(buf, len(buf))
        return buf.value.decode(errors="replace")

    def fault_path_problem(self, fault_path: str | None = None) -> str:
        """One line saying why the fault path asked for cannot be used ("" when it can)."""
        want = fault_path or os.environ.get(FAULT_PATH_ENV) or "auto"
        if want not in _PATHS:
            return f"{FAULT_PATH_ENV}={want}: expected uffd, sigsegv or auto"
        if want == "uffd":
            why = self.uffd_unavailable()
            if why:
                return f"{FAULT_PATH_ENV}=uffd: userfaultfd does not work here ({why})"
        return ""

    def activate(self, kernel: Any, fault_path: str | None = None) -> None:
        """Route the allocator's calls to ``kernel`` (kept alive while active).

        ``fault_path``: "uffd", "sigsegv" or "auto" (default: $UMBP_SIM_FAULT_PATH, else auto);
        FaultPathError when it cannot be used.
        """
        problem = self.fault_path_problem(fault_path)
        if problem:
            raise FaultPathError(problem)
        want = fault_path or os.environ.get(FAULT_PATH_ENV) or "auto"
        self.lib.umbp_sim_interposer_set_fault_path(_PATHS[want])
        capsule = kernel_capsule(kernel)
        get = ctypes.pythonapi.PyCapsule_GetPointer
        get.restype = ctypes.c_void_p
        get.argtypes = [ctypes.py_object, ctypes.c_char_p]
        ptr = get(capsule, b"umbp_sim.kernel")
        rc = self.lib.umbp_sim_interposer_activate(ptr)
        if rc == errno.EOPNOTSUPP:
            raise FaultPathError(self.fault_path_problem("uffd") or f"{FAULT_PATH_ENV}=uffd failed")
        if rc != 0:
            raise OSError(rc, "umbp_sim_interposer_activate failed")
        self._capsule = capsule

    def fault_path(self) -> str | None:
        """The active fault path: "uffd", "sigsegv", or None (inactive, or a real kernel)."""
        return _ACTIVE.get(int(self.lib.umbp_sim_interposer_fault_path()))

    def deactivate(self) -> None:
        self.lib.umbp_sim_interposer_deactivate()
        self._capsule = None

    def set_evidence_fd(self, fd: int) -> None:
        """Where a simulated death's evidence goes (``umbp_sim.external.evidence``): one frame
        on ``fd`` (made close-on-exec), nothing on stderr. -1: one line on stderr instead."""
        rc = self.lib.umbp_sim_interposer_set_evidence_fd(fd)
        if rc != 0:
            raise OSError(rc, f"umbp_sim_interposer_set_evidence_fd({fd}) failed")

    def add_caller_object(self, path: str) -> int:
        return int(self.lib.umbp_sim_interposer_add_caller_object(path.encode()))

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
