"""Package attributes imported on first use (PEP 562), each declared once.

A lazy package declares what it offers once, as the imports under its ``if TYPE_CHECKING:``
(``from umbp_sim.dump.facts import DumpFacts as DumpFacts``): mypy reads them as they are, and
:func:`exported` reads the same lines from the package's source (parsed, never run) into
``{name: submodule}`` when a name is first asked for. The package's ``__getattr__`` calls
:func:`attribute`: importing one submodule (the request's flags, a constant) then loads no
other, so ``umbp-sim replay --help`` builds its parser without the dump reader, the sglang
emulation or the simulator.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

_EXPORTED: dict[str, dict[str, str]] = {}  # package -> {name: submodule}, read once


def exported(package: str) -> dict[str, str]:
    """``{name: submodule}``: the package's own ``if TYPE_CHECKING:`` imports from its
    submodules (imports from elsewhere there only type its annotations)."""
    table = _EXPORTED.get(package)
    if table is None:
        import ast  # first use only: a command's --help never asks

        source = sys.modules[package].__file__
        assert source is not None
        with open(source, encoding="utf-8") as f:
            tree = ast.parse(f.read(), source)
        table = {}
        prefix = package + "."
        for node in tree.body:
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
                for imp in node.body:
                    module = imp.module or "" if isinstance(imp, ast.ImportFrom) else ""
                    if isinstance(imp, ast.ImportFrom) and module.startswith(prefix):
                        for alias in imp.names:
                            table[alias.asname or alias.name] = module.removeprefix(prefix)
        _EXPORTED[package] = table
    return table


def attribute(package: str, name: str, *more: str) -> Any:
    """``package.name``, imported from the submodule :func:`exported` names; ``__all__``: the
    exported names and ``more`` (what the package defines itself); AttributeError otherwise."""
    table = exported(package)
    if name == "__all__":
        return [*table, *more]
    if name not in table:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{package}.{table[name]}"), name)
