"""The one error type the dump reader raises."""

from __future__ import annotations

from umbp_sim.errors import UmbpSimError
from umbp_sim.vocabulary.exit_codes import EX_DATAERR, EX_NOINPUT


class DumpError(UmbpSimError):
    """A dump that cannot be read: missing required file, malformed line, corrupt archive.

    ``where`` names the file as the user can find it (``dump.tar.bz2:X/proc/meminfo``),
    ``line`` the 1-based line number when one line is to blame, ``kind`` is one of
    ``"missing"`` (a required file is absent), ``"malformed"`` (a file is there but cannot be
    read as the kernel writes it), ``"unreadable"`` (not a dump, corrupt archive, I/O error).
    The message is one line: ``where[:line]: reason``.
    """

    exit_code = EX_DATAERR

    def __init__(self, where: str, reason: str, line: int | None = None, kind: str = "malformed"):
        self.where = where
        self.line = line
        reason = "; ".join(x.strip(" -") for x in reason.splitlines() if x.strip())  # one line
        self.reason = reason
        self.kind = kind
        loc = f"{where}:{line}" if line is not None else where
        super().__init__(f"{loc}: {reason}")


class DumpNotFound(DumpError):
    """The path given as a dump does not exist (sysexits' EX_NOINPUT, as for a fleet argument
    that names no dump)."""

    exit_code = EX_NOINPUT
