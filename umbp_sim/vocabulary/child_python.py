"""The command line of a Python child that runs one of umbp-sim's modules.

``python -m MODULE`` puts the working directory first on ``sys.path``: started from a checkout
of umbp-sim (a source tree without the compiled ``_native``), the child would import that tree's
``umbp_sim`` instead of the one its parent runs, and fail. The child here replaces that first
entry with the directory the parent's ``umbp_sim`` was imported from, so both run the same
package, and keeps the working directory (an allocator's relative path stays valid).
"""

from __future__ import annotations

import sys
from pathlib import Path

_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)

# sys.argv of the child: ["-c", ROOT, MODULE, *args]; the module sees [its file, *args]. `-c`
# puts "" (the working directory) first on sys.path unless -P or PYTHONSAFEPATH is in force.
_LAUNCH = """\
import runpy, sys
root, module = sys.argv[1:3]
del sys.argv[1:3]
if sys.path[:1] == [""]:
    del sys.path[0]
sys.path.insert(0, root)
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def module_argv(module: str, *args: str) -> list[str]:
    """``[python, ..., *args]`` running ``module`` as ``__main__`` with this umbp_sim."""
    return [sys.executable, "-c", _LAUNCH, _PACKAGE_ROOT, module, *args]
