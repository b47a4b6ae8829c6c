"""Package attributes imported on first use (PEP 562).

A package lists what it offers by the submodule that holds it (:func:`exports`), and its
``__getattr__`` calls :func:`attribute`: importing one submodule (the request's flags, a
constant) then loads no other, so ``umbp-sim replay --help`` builds its parser without the dump
reader, the sglang emulation or the simulator.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any


def exports(**names_by_module: str) -> dict[str, str]:
    """``{name: submodule}`` from ``submodule="name name ..."`` (names separated by spaces)."""
    return {name: module for module, names in names_by_module.items() for name in names.split()}


def attribute(package: str, exports: Mapping[str, str], name: str) -> Any:
    """``package.name``, imported from ``package.<exports[name]>``; AttributeError otherwise."""
    if name not in exports:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
