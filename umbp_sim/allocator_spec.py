"""``--allocator SPEC``: which allocator a command runs.

A SPEC is one of
- a built-in profile of umbp-sim's own allocator: ``umbp-sim`` (today's behaviour),
  ``mori-624002c`` (mori's behaviour at that commit; alias ``mori``);
- a path to a built shared object: a Python extension module with mori's API
  (``UMBPHostMemAllocator``, ``UMBPHostBufferBacking``), prebuilt (run with the interposer
  preloaded) or built with ``umbp-sim build-allocator`` (linked against it);
- the name of an importable module with mori's Python API, e.g. ``mori.umbp``, found as
  ``python -m`` finds it: in the working directory first (the allocator's process then has that
  directory first on ``sys.path``), then on the path;
- a path to such a module's file, ``./mod.py``: the module ``mod`` imported with the file's
  directory first on ``sys.path`` (as ``python ./mod.py`` has it).
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass

from umbp_sim.allocator_profiles import ALIASES, PROFILES, ProfileError, canonical_profile
from umbp_sim.errors import UmbpSimError
from umbp_sim.vocabulary.bounded import shown, shown_path
from umbp_sim.vocabulary.exit_codes import EX_USAGE

_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class AllocatorSpecError(UmbpSimError):
    """A SPEC that names no allocator (usage error: exit 64)."""

    exit_code = EX_USAGE


@dataclass(frozen=True)
class AllocatorSpec:
    kind: str  # "builtin" | "module" | "shared-object"
    name: str  # profile name, module name, or the path as given
    path: str | None = None  # absolute path of a shared object
    # A module's: the directory its process puts first on sys.path (the working directory the
    # module was found in, a .py file's own directory); None: found on the path.
    directory: str | None = None

    def __str__(self) -> str:
        return self.name

    @property
    def import_name(self) -> str:
        """The module a ``module`` spec imports (a ``.py`` file's: its stem)."""
        if self.name.endswith(".py"):
            return os.path.basename(self.name)[: -len(".py")]
        return self.name


def parse_allocator_spec(text: str, arg: str = "--allocator") -> AllocatorSpec:
    """The allocator ``text`` names; AllocatorSpecError (one line naming ``arg`` and ``text``)
    if none."""
    t = text.strip()
    if t in PROFILES:
        return AllocatorSpec("builtin", t)
    if t in ALIASES:
        return AllocatorSpec("builtin", ALIASES[t])
    if t.endswith(".py"):
        return _python_file(t, text, arg)
    looks_like_path = "/" in t or t.endswith(".so") or ".so." in t
    if looks_like_path:
        if not os.path.isfile(t):
            raise AllocatorSpecError(f"{arg} {shown_path(text)}: no such file")
        with open(t, "rb") as f:
            if f.read(4) != b"\x7fELF":
                raise AllocatorSpecError(f"{arg} {shown_path(text)}: not a shared object (ELF)")
        return AllocatorSpec("shared-object", t, os.path.abspath(t))
    if _MODULE_NAME.match(t):
        return AllocatorSpec("module", t, directory=_in_working_directory(t))
    known = ", ".join(PROFILES + tuple(ALIASES))
    raise AllocatorSpecError(
        f"{arg} {shown(text)}: not a built-in profile ({known}), a module name or a path to a "
        "shared object"
    )


def _python_file(t: str, text: str, arg: str) -> AllocatorSpec:
    """A ``.py`` path: the module its stem names, imported from the file's directory."""
    if not os.path.isfile(t):
        raise AllocatorSpecError(f"{arg} {shown_path(text)}: no such file")
    stem = os.path.basename(t)[: -len(".py")]
    if not _MODULE_NAME.match(stem) or "." in stem:
        fixed = re.sub(r"[^A-Za-z0-9_]", "_", stem)
        fixed = fixed if fixed[:1].isalpha() or fixed[:1] == "_" else f"_{fixed}"
        raise AllocatorSpecError(
            f"{arg} {shown_path(text)}: {shown(stem)} is not a Python module name (rename the "
            f"file like {fixed}.py)"
        )
    return AllocatorSpec("module", t, directory=os.path.dirname(os.path.abspath(t)))


def _in_working_directory(name: str) -> str | None:
    """The working directory, when the top-level part of the module ``name`` is there (a
    module, an extension or a package with its ``__init__``: what ``python -m`` imports from
    it first); None otherwise."""
    import importlib.machinery

    cwd = os.getcwd()
    try:
        spec = importlib.machinery.PathFinder.find_spec(name.split(".")[0], [cwd])
    except (ImportError, ValueError):
        return None
    return cwd if spec is not None and spec.origin is not None else None


def module_location(name: str, directory: str | None = None) -> str | None:
    """Where the module ``name`` (``pkg.sub.mod``) would be imported from, found without
    importing anything: the top-level name in ``directory`` first (a spec's), then through
    ``sys.meta_path``'s finders (which import nothing for a top-level name), each further part
    in its package's directories (``PathFinder``), so no package's ``__init__`` runs in this
    process. None: not found (or a package whose ``__init__`` would have to run to tell)."""
    import importlib.machinery
    import importlib.util

    parts = name.split(".")
    try:
        spec = None
        if directory:
            spec = importlib.machinery.PathFinder.find_spec(parts[0], [directory])
        spec = spec or importlib.util.find_spec(parts[0])
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


def allocator_flag(value: str) -> str:
    """``--allocator``'s argparse type: a built-in profile's canonical name, or an external
    build's SPEC (a path, a module)."""
    try:
        return canonical_profile(value)
    except ProfileError as e:
        try:
            spec = parse_allocator_spec(value)
        except AllocatorSpecError as spec_error:
            raise argparse.ArgumentTypeError(
                str(e) if "/" not in value and ".so" not in value else str(spec_error)
            ) from None
        # Found without importing it (nor its package) here: the allocator's process does.
        if spec.kind == "module" and module_location(spec.import_name, spec.directory) is None:
            raise argparse.ArgumentTypeError(
                f"{e}, a path to a built .so, or an importable module (no module named "
                f"{shown(spec.import_name)})"
            ) from None
        return spec.path or spec.name
