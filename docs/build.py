"""Builds the API reference of umbp-sim's public modules with pdoc, warnings as errors.

    python docs/build.py [-o OUT]      # default OUT: build/docs/api (open OUT/index.html)

Fails (exit 1) on any warning pdoc raises (an import error, a bad link) and on any public
function, class or method of these modules without a docstring, so the reference has no
empty entries. `tox -e docs` runs this; CI runs that env.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The public API: the package (its __all__: the mori.umbp drop-in, Machine, simulate ...) and
# the modules other projects' code and tests import. Everything else is internal.
PUBLIC = [
    "umbp_sim",
    "umbp_sim.machine",
    "umbp_sim.sim",
    "umbp_sim.faults",
    "umbp_sim.strategies",
    "umbp_sim.request",
    "umbp_sim.pytest_plugin",
    "umbp_sim.mori_compat",
    "umbp_sim.progress",
    "umbp_sim.errors",
]


def undocumented(modules: list[str]) -> list[str]:
    """Public functions, classes and methods of ``modules`` that have no docstring."""
    import pdoc.doc

    missing: list[str] = []

    def check(members: list[pdoc.doc.Doc], owner: str) -> None:  # type: ignore[type-arg]
        for member in members:
            if member.name.startswith("_") or isinstance(member, pdoc.doc.Variable):
                continue
            if member.taken_from[0] != owner:  # re-exported: documented where it is defined
                continue
            if not (member.docstring or "").strip():
                missing.append(member.fullname)
            if isinstance(member, pdoc.doc.Class):
                check(member.own_members, owner)

    for name in modules:
        check(pdoc.doc.Module.from_name(name).own_members, name)
    return missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, default=ROOT / "build" / "docs" / "api")
    args = parser.parse_args(argv)
    output = args.output.resolve()
    # Outside the repository: there `umbp_sim` would also name the source tree's directory
    # (pdoc warns which one it takes; the installed package, with its compiled _native, is it).
    os.chdir(tempfile.gettempdir())
    warnings.simplefilter("error")  # pdoc reports problems as warnings: make them fatal

    import pdoc

    import umbp_sim

    # umbp_sim loads its public names on first use (PEP 562, so `umbp-sim --help` stays
    # light); pdoc reads the module's namespace, so load them all first.
    for name in umbp_sim.__all__:
        getattr(umbp_sim, name)
    missing = undocumented(PUBLIC)
    if missing:
        print("docs/build.py: no docstring: " + ", ".join(missing), file=sys.stderr)
        return 1
    pdoc.render.configure(docformat="restructuredtext", footer_text="umbp-sim")
    # the package alone (not its internal submodules), then each public module
    pdoc.pdoc(PUBLIC[0], "!umbp_sim\\..*", *PUBLIC[1:], output_directory=output)
    print(f"API reference: {output / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
