"""Where the bundled scenarios are: installed with the package, or the source tree's."""

from __future__ import annotations

from pathlib import Path


def bundled_scenarios_dir() -> Path:
    here = Path(__file__).resolve().parent.parent  # umbp_sim/
    installed = here / "scenarios"
    if installed.is_dir():
        return installed
    return here.parent / "scenarios"  # an editable install or a source checkout
