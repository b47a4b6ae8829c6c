"""TOML text read into a dict: :func:`read_toml`, whose every refusal is a :class:`TomlError`.

tomllib is imported when a document is read, not with this module: the modules an allocator's
server holds (a fault plan's types among them) are copied by each run's fork, and tomllib brings
datetime with it.
"""

from __future__ import annotations

import sys
from typing import Any


class TomlError(ValueError):
    """Text that is not a TOML document umbp-sim can read; the message is one line."""


def read_toml(text: str) -> dict[str, Any]:
    """``tomllib.loads`` whose every refusal is a TomlError: invalid TOML, and what tomllib
    itself cannot hold (an integer of more than 4,300 digits, arrays or inline tables nested
    past Python's recursion limit)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise TomlError(" ".join(str(e).split())) from None
    except RecursionError:
        raise TomlError("arrays or tables nested too deeply to read") from None
    except ValueError as e:  # int(): "Exceeds the limit (4300 digits) ..."
        raise TomlError(f"a number too long to read ({' '.join(str(e).split())[:80]})") from None
