"""The stand-alone collectors ``umbp-sim collect --script`` prints (stdlib python3, POSIX sh).

Each is one file with no imports from umbp_sim, to be copied to a host where umbp-sim cannot be
installed. Both write the tarball ``umbp-sim collect`` writes (see ``umbp_sim/live_dump.py``).
"""

from __future__ import annotations

from importlib import resources

SCRIPTS = {"py": "standalone_collect.py", "sh": "standalone_collect.sh"}


def script_text(kind: str) -> str:
    """The text of the collector ``kind`` ("py" or "sh")."""
    return resources.files(__name__).joinpath(SCRIPTS[kind]).read_text(encoding="utf-8")
