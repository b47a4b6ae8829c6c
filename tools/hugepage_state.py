#!/usr/bin/env python3
"""Hugepage pools changed by tests: the lock, the record of the originals, and their restore.

Tests that change a pool (``vm.nr_hugepages`` and the per-size pools) hold ``LOCK`` for their
whole duration and, before their first change, write every pool knob's value to ``RECORD``
beside it (``/tmp/umbp-sim-hugepage-pool.saved``, JSON ``{path: value}``). Undoing the change
removes the record. A record found when the lock is taken was left by a run that died without
its finalizers (SIGKILL, OOM kill, a lost machine): ``restore_stale()`` writes it back, globals
first, then per node, and removes it. That runs at every pytest session start and at every
acquisition of the ``nr_hugepages`` fixture (tests/conftest.py), at the start of
tools/sysctl_guard.py, and in .ci/run before and after the tests::

    python3 tools/hugepage_state.py restore   # exit 0: restored or nothing to restore

Safety: the lock is opened with O_NOFOLLOW and must be a regular file owned by this user; the
record is read the same way and must not be writable by others, and only pool knobs it names
are written, with integer values. The record is replaced by rename from an O_EXCL temporary
file, never written through a planted link. Standard library only: .ci/run calls this before
anything is installed.
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import re
import stat
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

LOCK = "/tmp/umbp-sim-hugepage-pool.lock"
RECORD = "/tmp/umbp-sim-hugepage-pool.saved"
SYSFS = "/sys/kernel/mm/hugepages"
NODES = "/sys/devices/system/node"

# The knobs a record may name (anything else in a record is refused, not written).
_KNOB = re.compile(
    r"^(?:/proc/sys/vm/(?:nr_hugepages|nr_overcommit_hugepages)"
    r"|/sys/kernel/mm/hugepages/hugepages-[0-9]+kB/(?:nr_hugepages|nr_overcommit_hugepages)"
    r"|/sys/devices/system/node/node[0-9]+/hugepages/hugepages-[0-9]+kB/nr_hugepages)$"
)


class StateError(Exception):
    """The lock or the record cannot be used safely; the message says which and why."""


def pool_knobs() -> list[str]:
    """Every pool knob of this host: per size (global), then per node and size."""
    return [
        *sorted(glob.glob(f"{SYSFS}/hugepages-*/nr_hugepages")),
        *sorted(glob.glob(f"{SYSFS}/hugepages-*/nr_overcommit_hugepages")),
        *sorted(glob.glob(f"{NODES}/node*/hugepages/hugepages-*/nr_hugepages")),
    ]


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def snapshot() -> dict[str, str]:
    return {k: v for k in pool_knobs() if (v := _read(k)) is not None}


def _open_checked(path: str, flags: int, what: str) -> int:
    """Open without following a symbolic link; it must be a regular file owned by us."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise StateError(f"{what} {path}: cannot open: {e.strerror}") from None
    st = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(st.st_mode):
        problem = "is not a regular file"
    elif st.st_uid != os.geteuid():
        problem = f"is owned by uid {st.st_uid}, not {os.geteuid()}"
    elif st.st_mode & 0o022:
        problem = "is writable by others"
    if problem:
        os.close(fd)
        raise StateError(f"{what} {path}: {problem}; remove it")
    return fd


@contextmanager
def locked(lock: str = LOCK) -> Iterator[None]:
    """Hold the pool lock (blocking) for the body."""
    fd = _open_checked(lock, os.O_RDWR | os.O_CREAT, "lock file")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the flock


def read_record(record: str = RECORD) -> dict[str, str] | None:
    """The record's {path: value}, or None when there is none."""
    if not os.path.lexists(record):
        return None
    fd = _open_checked(record, os.O_RDONLY, "record")
    with os.fdopen(fd) as f:
        try:
            doc = json.load(f)
        except ValueError:
            raise StateError(f"record {record}: not JSON; remove it") from None
    if not isinstance(doc, dict):
        raise StateError(f"record {record}: not a JSON object; remove it")
    for k, v in doc.items():
        if not _KNOB.match(k) or not isinstance(v, str) or not v.isdecimal():
            raise StateError(f"record {record}: {k!r} = {v!r} is not a pool knob and a count")
    return doc


def write_record(values: dict[str, str], record: str = RECORD) -> None:
    """Replace the record atomically (O_EXCL temporary file, fsync, rename)."""
    fd, tmp = tempfile.mkstemp(prefix=".umbp-sim-hugepage-pool.", dir=os.path.dirname(record))
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(values, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, record)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def remove_record(record: str = RECORD) -> None:
    try:
        os.unlink(record)
    except FileNotFoundError:
        pass


def restore(values: dict[str, str]) -> list[str]:
    """Write back every knob whose value differs (globals first, then per node); the problems
    left (a knob that reads back different, e.g. pages still in use), one line each."""
    order = sorted(values, key=lambda k: ("/node/" in k, k))
    for path in order:
        if _read(path) != values[path]:
            try:
                with open(path, "w") as f:
                    f.write(values[path] + "\n")
            except OSError:
                pass  # reported below as a value that did not come back
    problems = []
    for path in order:
        now = _read(path)
        if now is not None and now != values[path]:
            problems.append(f"{path} is {now} after restoring {values[path]} (pages still in use?)")
    return problems


def restore_stale(lock: str = LOCK, record: str = RECORD) -> list[str]:
    """Take the lock and restore a record a dead run left behind. Returns what was done and
    what failed, one line each (empty when there was nothing to do)."""
    if not os.path.lexists(record):
        return []
    if os.geteuid() != 0:
        return [f"{record}: a killed test run left hugepage pools changed; restore as root"]
    with locked(lock):
        return restore_stale_locked(record)


def restore_stale_locked(record: str = RECORD) -> list[str]:
    """``restore_stale`` for a caller that holds the lock already."""
    values = read_record(record)
    if values is None:
        return []  # its owner finished while we waited for the lock
    before = {k: _read(k) for k in values}
    problems = restore(values)
    changed = [f"{k}: {before[k]} -> {v}" for k, v in sorted(values.items()) if before[k] != v]
    if not problems:
        remove_record(record)
    head = "restored the hugepage pools a killed test run left changed"
    return [f"{head}: {', '.join(changed) or 'nothing differed'}", *problems]


def main(argv: list[str]) -> int:
    if argv != ["restore"]:
        print("usage: hugepage_state.py restore", file=sys.stderr)
        return 64
    try:
        lines = restore_stale()
    except StateError as e:
        print(f"hugepage_state: {e}", file=sys.stderr)
        return 1
    for line in lines:
        print(f"hugepage_state: {line}", file=sys.stderr)
    return 1 if len(lines) > 1 or (lines and "restore as root" in lines[0]) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
