"""umbp_sim's imports between its own modules, read from the installed package's source (parsed,
not run), counting the imports inside functions and under ``if TYPE_CHECKING:`` too: a
function-level import does not make a dependency go away, it hides it. Used by
tests/test_import_cycles.py and tests/test_layers.py."""

from __future__ import annotations

import ast
from pathlib import Path

import umbp_sim

PACKAGE = Path(umbp_sim.__file__).parent


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ["umbp_sim", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(module: str, path: Path, known: dict[str, Path]) -> dict[str, int]:
    """The umbp_sim modules ``module`` imports anywhere in its source, each with the line of its
    first import (the root package, every module's parent, left out)."""
    is_package = path.name == "__init__.py"
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")[: None if is_package else -1]
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name not in (module, "umbp_sim"):
                line = node.lineno
                found[name] = min(found.get(name, line), line)
    return found


def graph() -> dict[str, dict[str, int]]:
    """``{module: {imported module: line}}`` for the whole package."""
    known = modules()
    return {m: imports(m, p, known) for m, p in known.items()}
