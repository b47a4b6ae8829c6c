"""A dump on standard input: ``umbp-sim replay -``, ``umbp-sim preflight --root -``.

What arrives is text as pasted (a meminfo, whole or grep'd, ``numactl -H``, sysfs values...:
``umbp_sim.dump.paste``; or ``ssh host cat /proc/meminfo |``) or the bytes of a dump tarball
(``ssh host umbp-sim collect -o /dev/stdout |``); ``bytes_source`` tells which.
Errors name it ``<stdin>`` (``<stdin>:3: cannot read value ...``). Standard input can carry one
thing: with ``--error -`` too (or beside other dumps), ``StdinUsageError`` (exit 64) says so
before anything is read.
"""

from __future__ import annotations

import sys
from typing import BinaryIO

from umbp_sim.dump.dump_error import DumpError
from umbp_sim.dump.limits import DEFAULT_LIMITS, ArchiveLimits
from umbp_sim.dump.opener import bytes_source
from umbp_sim.dump.source import MemorySource
from umbp_sim.errors import UmbpSimError
from umbp_sim.vocabulary.exit_codes import EX_USAGE

LABEL = "<stdin>"
STDIN = "-"


class StdinUsageError(UmbpSimError):
    """Standard input asked for twice (dump and error line), or beside other dumps."""

    exit_code = EX_USAGE


def check_one_reader(dumps: list[str], error_arg: str | None, dump_flag: str) -> None:
    """Refuse ``-`` for both the dump (``dump_flag`` names its argument) and ``--error``, and
    ``-`` among several dumps."""
    if STDIN in dumps and len(dumps) > 1:
        raise StdinUsageError(
            f"{dump_flag} -: standard input is one dump; replay it alone, or save it to a file "
            "to replay it with the others"
        )
    if STDIN in dumps and error_arg == STDIN:
        raise StdinUsageError(
            f"{dump_flag} - and --error -: standard input holds one of them, not both; give the "
            "error line itself (--error 'RuntimeError: UMBPHostMemAllocator.alloc(...') or the "
            "dump as a file"
        )


def stdin_source(
    stream: BinaryIO | None = None, limits: ArchiveLimits = DEFAULT_LIMITS
) -> MemorySource:
    """The dump on ``stream`` (default: standard input), read whole within ``limits``."""
    stream = stream if stream is not None else sys.stdin.buffer
    if stream.isatty():
        print("umbp-sim: reading a paste from the terminal (meminfo, numactl -H, sysfs "
              "values...): paste it, then Ctrl-D", file=sys.stderr)  # fmt: skip
    try:
        data = stream.read(limits.max_archive + 1)
    except OSError as e:
        raise DumpError(LABEL, f"cannot read: {e.strerror}", kind="unreadable") from None
    if len(data) > limits.max_archive:
        raise DumpError(LABEL, f"larger than {limits.max_archive} bytes", kind="unreadable")
    if not data.strip():
        raise DumpError(
            LABEL, "empty: expected a meminfo file or a dump tarball on standard input",
            kind="missing",
        )  # fmt: skip
    return bytes_source(data, LABEL, limits=limits)
