"""Which sglang's ``UMBPHostTensorAllocator`` a simulation runs.

- a release umbp-sim emulates (:data:`EMULATED`: ``umbp_sim.sglang.tensor_allocator``);
- ``installed``: the ``umbp_host_allocator`` module of the sglang in this environment, loaded by
  path without importing the rest of sglang (whose other modules pull in heavy dependencies).
  Its one sglang import, the abstract ``HostTensorAllocator`` base, is given a stand-in with the
  real base's constructor; ``import mori.umbp`` inside it resolves through
  ``umbp_sim.mori_compat`` to the allocator profile being simulated.

The default is ``installed`` when sglang is installed, else the newest emulated release.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import threading
import types
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from umbp_sim.errors import UmbpSimError
from umbp_sim.vocabulary.exit_codes import EX_USAGE

EMULATED = ("0.5.23",)  # 0.5.23 is also the newest release on the package index (2026-12-03)
SGLANG_RELEASES = ("installed", *EMULATED)
MODULE_NAME = "sglang.srt.mem_cache.storage.umbp.umbp_host_allocator"
_MODULE_PATH = ("srt", "mem_cache", "storage", "umbp", "umbp_host_allocator.py")
_BASE_MODULE = "sglang.srt.mem_cache.pool_host.common"

_lock = threading.Lock()
_loaded: types.ModuleType | None = None


class SglangNotInstalled(UmbpSimError):
    """``--sglang installed`` without an sglang (or without its UMBP allocator module)."""

    exit_code = EX_USAGE


def installed_module_path() -> Path | None:
    """The installed sglang's umbp_host_allocator.py, or None (sglang itself is not imported)."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        path = Path(root).joinpath(*_MODULE_PATH)
        if path.is_file():
            return path
    return None


def installed_version() -> str | None:
    from importlib import metadata  # ~40 modules: not for `replay --help`, which reads this file

    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def default_sglang_release() -> str:
    return "installed" if installed_module_path() is not None else EMULATED[-1]


def describe_release(release: str) -> str:
    """One line for a report: which sglang was modelled and how."""
    if release == "installed":
        return f"sglang {installed_version() or '?'} as installed (its umbp_host_allocator module)"
    return f"sglang {release} (umbp-sim's emulation of its UMBPHostTensorAllocator)"


class _HostTensorAllocator:
    """Stand-in for sglang's abstract base (pool_host/common.py): its constructor only."""

    def __init__(self) -> None:
        self.dtype = None
        self.dims = None


def load_installed_module() -> types.ModuleType:
    """The installed sglang's umbp_host_allocator module, loaded once by path."""
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        path = installed_module_path()
        if path is None:
            raise SglangNotInstalled(
                "--sglang installed: no sglang with mem_cache/storage/umbp/umbp_host_allocator.py "
                f"in this environment (use one of {', '.join(EMULATED)})"
            )
        base = types.ModuleType(_BASE_MODULE)
        base.HostTensorAllocator = _HostTensorAllocator  # type: ignore[attr-defined]
        saved = {n: sys.modules.get(n) for n in (_BASE_MODULE,)}
        sys.modules[_BASE_MODULE] = base
        try:
            spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        finally:
            for name, old in saved.items():
                if old is None:
                    sys.modules.pop(name, None)
                else:
                    sys.modules[name] = old
        _loaded = module
        return module


@contextmanager
def _environ(env: Mapping[str, str]) -> Iterator[None]:
    # sglang reads os.environ in its constructor; the simulated server's settings replace the
    # variables it reads for that call only.
    names = {k for k in os.environ if k.startswith(("SGLANG_HICACHE_HOST_", "UMBP_"))} | set(env)
    saved = {k: os.environ.get(k) for k in names}
    for k in names:
        os.environ.pop(k, None)
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class InstalledTensorAllocator:
    """The installed sglang's UMBPHostTensorAllocator, with the emulation's bookkeeping.

    ``allocate`` is the real one; ``owned_handles``, ``demotions`` and ``close`` read its
    handle table as sglang leaves it.
    """

    def __init__(self, env: Mapping[str, str] | None, *, module: Any) -> None:
        from umbp_sim.mori_compat import mori_umbp

        real = load_installed_module()
        self._mod = module
        with _environ(dict(env or {})), mori_umbp(source=module):
            self._real = real.UMBPHostTensorAllocator()
        self.demotions = 0

    def allocate(self, dims: Any, dtype: Any, device: str = "cpu") -> Any:
        before = set(self._real._handles)
        tensor = self._real.allocate(dims, dtype, device)
        b = self._mod.UMBPHostBufferBacking
        for ptr in set(self._real._handles) - before:
            handle = self._real._handles[ptr]
            plain = b.AnonymousShm if self._real._standalone_process else b.Anonymous
            if self._real._use_hugepage and handle.actual_backing == plain:
                self.demotions += 1
        return tensor

    @property
    def owned_handles(self) -> tuple[Any, ...]:
        return tuple(self._real._handles.values())

    def close(self) -> None:
        self._real.__del__()


def tensor_allocator(release: str, env: Mapping[str, str] | None, module: Any) -> Any:
    """A UMBPHostTensorAllocator of ``release`` over ``module`` (a mori.umbp-like module)."""
    if release == "installed":
        return InstalledTensorAllocator(env, module=module)
    if release not in EMULATED:
        raise SglangNotInstalled(f"unknown sglang release {release!r} (use {SGLANG_RELEASES})")
    from umbp_sim.sglang.tensor_allocator import UMBPHostTensorAllocator

    return UMBPHostTensorAllocator(env, module=module)


logging.getLogger(MODULE_NAME)  # the logger the installed module and the emulation both use
