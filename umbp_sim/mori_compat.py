"""Run unmodified code written against ``mori.umbp`` on umbp-sim.

    with umbp_sim.mori_compat.mori_umbp():
        import mori.umbp                      # umbp-sim's allocator
        from mori.umbp import UMBPHostMemAllocator, UMBPHostBufferBacking

Inside the block ``mori`` is a stand-in package whose only submodule is ``mori.umbp``: a module
holding umbp-sim's mori-compatible surface (``UMBPHostMemAllocator``, ``UMBPHostBufferBacking``,
``UMBPHostBufferHandle``). By default its allocator is mori's as deployed (the ``mori-624002c``
profile with mori's Python binding); ``mori_umbp(profile="umbp-sim")`` gives umbp-sim's fixed
allocator instead. Allocators made there use the real kernel, or the simulated one inside
``umbp_sim.simulate(...)``.

On exit, also when the block raises, ``sys.modules`` is put back: every ``mori`` and ``mori.*``
entry is again the object it was (a really installed mori included) or absent if it was absent,
and modules first imported inside the block that bound the stand-in (``import mori.umbp`` at
module level in a caller) are forgotten, so importing them again outside binds the real mori.
umbp-sim's own modules and modules that never touched the stand-in are left loaded.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

EXPORTS = ("UMBPHostMemAllocator", "UMBPHostBufferBacking", "UMBPHostBufferHandle")
REQUIRED = ("UMBPHostMemAllocator", "UMBPHostBufferBacking")


def _is_mori_key(name: str) -> bool:
    return name == "mori" or name.startswith("mori.")


def _surface(source: Any) -> types.ModuleType:
    missing = [n for n in REQUIRED if not hasattr(source, n)]
    if missing:
        raise RuntimeError(
            f"mori_compat: {getattr(source, '__name__', source)!r} has no {', '.join(missing)} "
            "(is umbp-sim's native allocator built?)"
        )
    umbp = types.ModuleType("mori.umbp", "umbp-sim standing in for mori.umbp")
    for name in EXPORTS:
        if hasattr(source, name):
            setattr(umbp, name, getattr(source, name))
    umbp.__umbp_sim_source__ = source  # type: ignore[attr-defined]
    umbp.__umbp_sim_profile__ = getattr(source, "__umbp_sim_profile__", None)  # type: ignore[attr-defined]
    return umbp


def _binds(module: object, stand_ins: list[object]) -> bool:
    namespace = getattr(module, "__dict__", None)
    if not isinstance(namespace, dict):
        return False
    return any(v is s for v in list(namespace.values()) for s in stand_ins)


def mori_module(profile: str | None = None) -> types.ModuleType:
    """A ``mori.umbp``-like module whose allocator follows ``profile`` (default: the field's)."""
    from umbp_sim import allocator
    from umbp_sim.allocator_profiles import FIELD_PROFILE, canonical_profile

    profile = canonical_profile(profile or FIELD_PROFILE)
    mod = types.ModuleType("mori.umbp", f"umbp-sim's {profile} allocator standing in for mori.umbp")
    mod.UMBPHostMemAllocator = allocator.allocator_class(profile)  # type: ignore[attr-defined]
    mod.UMBPHostBufferBacking = allocator.UMBPHostBufferBacking  # type: ignore[attr-defined]
    mod.UMBPHostBufferHandle = allocator.UMBPHostBufferHandle  # type: ignore[attr-defined]
    mod.__umbp_sim_profile__ = profile  # type: ignore[attr-defined]
    return mod


@contextmanager
def mori_umbp(source: Any = None, profile: str | None = None) -> Iterator[types.ModuleType]:
    """Make ``import mori.umbp`` resolve to umbp-sim (or ``source``) inside the block.

    ``source`` is any object with the mori.umbp names; default: :func:`mori_module` of
    ``profile`` (mori's allocator as deployed unless ``profile="umbp-sim"``).
    Yields the module installed as ``mori.umbp``.
    """
    if source is None:
        source = mori_module(profile)
    umbp = _surface(source)
    package = types.ModuleType("mori", "umbp-sim standing in for mori (only mori.umbp)")
    package.__path__ = []  # a package, so "import mori.umbp" is legal; nothing else is found
    package.umbp = umbp  # type: ignore[attr-defined]

    saved = {k: v for k, v in sys.modules.items() if _is_mori_key(k)}
    before = set(sys.modules)
    for k in saved:
        del sys.modules[k]
    sys.modules["mori"] = package
    sys.modules["mori.umbp"] = umbp
    try:
        yield umbp
    finally:
        for k in [k for k in sys.modules if _is_mori_key(k)]:
            del sys.modules[k]
        sys.modules.update(saved)
        stand_ins: list[object] = [package, umbp]
        stand_ins += [getattr(umbp, n) for n in EXPORTS if hasattr(umbp, n)]
        for name in [n for n in sys.modules if n not in before]:
            if name == "umbp_sim" or name.startswith("umbp_sim."):
                continue
            if _binds(sys.modules[name], stand_ins):
                del sys.modules[name]
