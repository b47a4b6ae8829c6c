"""A file a command writes besides its report (``--html``, ``--junit``, exec's ``--json``),
checked as ``collect -o`` checks its tarball: :class:`OutputFile`.

The check and the write are the stand-alone collector's (``check_output``, ``write_new`` in
``umbp_sim/collect_scripts/standalone_collect.py``), so every output file of umbp-sim is refused or
written the same way: before the work, a path that is not a regular file (a symbolic link, dangling
or not, a directory, a device such as ``/dev/full``, a FIFO, a socket) or whose directory cannot
take a new file is refused in one line (:class:`OutputFileError`, exit 73); after it, the file
is written to a fresh temporary file beside it and moved into place, so an existing file is
never emptied first, never written through a link, and stays whole when the command fails.
"""

from __future__ import annotations

from umbp_sim.errors import UmbpSimError
from umbp_sim.vocabulary.exit_codes import EX_CANTCREAT


class OutputFileError(UmbpSimError):
    """An output file cannot be written or is refused (exit 73, like collect's output)."""

    exit_code = EX_CANTCREAT


class OutputFile:
    """``flag``'s FILE, checked when made (before the work) and written only by :meth:`write`
    or :meth:`place` (``discard``: nothing was created before it, kept for the callers'
    clean-up paths). ``dash=False``: an ``-o`` that does not take ``-`` for stdout (a file named
    ``-``)."""

    def __init__(self, path: str, flag: str, dash: bool | None = None) -> None:
        self.path = path
        self.flag = flag  # the option that named the file, in errors
        self.dash = dash
        self.written = False
        self._call("check_output", path, flag, dash)

    def _call(self, step: str, *args: object) -> None:
        # imported here: the script imports tarfile, which a command's --help does not need
        from umbp_sim.collect_scripts import standalone_collect as standalone

        try:
            getattr(standalone, step)(*args)
        except OSError as e:  # the script's one line: "FLAG PATH: ..."
            raise OutputFileError(str(e)) from None

    def write(self, text: str) -> None:
        """``text`` as the file (UTF-8), replacing a regular file there, keeping its mode."""
        self._call("write_new", self.path, text.encode("utf-8"), self.flag, True, self.dash)
        self.written = True

    def place(self, tmp: str) -> None:
        """The file ``tmp``, made in this file's directory (a compiler's output), moved into
        place as :meth:`write` moves its own: a regular file there replaced whole, anything
        else refused; ``tmp`` is gone afterwards."""
        self._call("move_into_place", tmp, self.path, self.flag, self.dash)
        self.written = True

    def discard(self) -> None:
        """Nothing to undo: the file is only ever created by ``write``."""
