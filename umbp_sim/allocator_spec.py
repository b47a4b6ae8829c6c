"""``--allocator SPEC``: which allocator a command runs.

A SPEC is one of
- a built-in profile of umbp-sim's own allocator: ``umbp-sim`` (today's behaviour),
  ``mori-624002c`` (mori's behaviour at that commit; alias ``mori``);
- a path to a built shared object: a Python extension module with mori's API
  (``UMBPHostMemAllocator``, ``UMBPHostBufferBacking``), prebuilt (run with the interposer
  preloaded) or built with ``umbp-sim build-allocator`` (linked against it);
- the name of an importable module with mori's Python API, e.g. ``mori.umbp``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from umbp_sim.errors import UmbpSimError
from umbp_sim.profiles import ALIASES, PROFILES
from umbp_sim.value_types import shown, shown_path

_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class AllocatorSpecError(UmbpSimError):
    """A SPEC that names no allocator (usage error: exit 64)."""

    exit_code = 64


@dataclass(frozen=True)
class AllocatorSpec:
    kind: str  # "builtin" | "module" | "shared-object"
    name: str  # profile name, module name, or the path as given
    path: str | None = None  # absolute path of a shared object

    def __str__(self) -> str:
        return self.name


def parse_allocator_spec(text: str, arg: str = "--allocator") -> AllocatorSpec:
    """The allocator ``text`` names; AllocatorSpecError (one line naming ``arg`` and ``text``)
    if none."""
    t = text.strip()
    if t in PROFILES:
        return AllocatorSpec("builtin", t)
    if t in ALIASES:
        return AllocatorSpec("builtin", ALIASES[t])
    looks_like_path = "/" in t or t.endswith(".so") or ".so." in t
    if looks_like_path:
        if not os.path.isfile(t):
            raise AllocatorSpecError(f"{arg} {shown_path(text)}: no such file")
        with open(t, "rb") as f:
            if f.read(4) != b"\x7fELF":
                raise AllocatorSpecError(f"{arg} {shown_path(text)}: not a shared object (ELF)")
        return AllocatorSpec("shared-object", t, os.path.abspath(t))
    if _MODULE_NAME.match(t):
        return AllocatorSpec("module", t)
    known = ", ".join(PROFILES + tuple(ALIASES))
    raise AllocatorSpecError(
        f"{arg} {shown(text)}: not a built-in profile ({known}), a module name or a path to a "
        "shared object"
    )


def module_location(name: str) -> str | None:
    """Where the module ``name`` (``pkg.sub.mod``) would be imported from, found without
    importing anything: the top-level name through ``sys.meta_path``'s finders (which import
    nothing for a top-level name), each further part in its package's directories
    (``PathFinder``), so no package's ``__init__`` runs in this process. None: not found (or a
    package whose ``__init__`` would have to run to tell)."""
    import importlib.machinery
    import importlib.util

    parts = name.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        return None
    for i in range(1, len(parts)):
        if spec is None or not spec.submodule_search_locations:
            return None
        locations = list(spec.submodule_search_locations)
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]), locations)
    if spec is None:
        return None
    return spec.origin or ".".join(parts)


def is_external(name: str) -> bool:
    """Whether ``name`` (an ``--allocator`` value) is an external build, not a built-in profile."""
    t = name.strip()
    return t not in PROFILES and t not in ALIASES
