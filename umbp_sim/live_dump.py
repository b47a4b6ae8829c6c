"""Dump the live host's /proc and /sys into a tarball that ``dump.load_machine`` reads back.

``collect(out, name)`` writes ``NAME/proc/...`` and ``NAME/sys/...`` (the fixtures' layout):
meminfo, the vm sysctls, the kernel release (as ``proc/sys/kernel/osrelease``), this process's
``proc/self/limits``, every readable file under ``sys/kernel/mm/hugepages``, the node lists and
each ``nodeN/{meminfo,cpulist,distance,hugepages/**}``, and the current cgroup's limits under
their cgroup v2 names (``sys/fs/cgroup/memory.max``, ``sys/fs/cgroup/hugetlb.<size>.max``,
``hugetlb.<size>.rsvd.max``).
A file that cannot be read is listed in ``NAME/umbp-sim-collect.json`` and never fatal. The
manifest also records this host's ``uname -m`` (``machine``) and base page size
(``page_size``), which the dump reader takes over inferring them (``umbp_sim/dump/arch.py``).

Cgroup limits: the effective limit is the smallest along the path from the current cgroup to
the root (a parent's ``memory.max`` binds the child). The cgroup v2 path comes from the ``0::``
line of ``/proc/self/cgroup`` and the cgroup2 mount from ``/proc/self/mountinfo``. On a v1
(or hybrid) host whose v2 tree has no limit files, the v1 ``memory`` and ``hugetlb``
controllers' ``*.limit_in_bytes`` are read instead and written under the v2 names (the v1
"no limit" value, ``PAGE_COUNTER_MAX`` pages, becomes ``max``); the manifest says so.

``root`` (default ``/``) lets tests collect from a directory laid out like a host.

One implementation: the reading, the cgroup walk, the manifest and the tarball are the
stand-alone collector's (``umbp_sim/collect_scripts/standalone_collect.py``, stdlib python3 3.6+,
which cannot import umbp_sim); this module gives them a typed entry point and CollectError. It
differs from ``collect.py`` (without ``--pid``) only in the manifest's ``tool``, no
``pid`` or ``left_out`` keys and an unreadable ``/proc/self/cgroup`` listed as missing.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from umbp_sim.collect_scripts import standalone_collect as standalone
from umbp_sim.errors import UmbpSimError
from umbp_sim.vocabulary.exit_codes import EX_CANTCREAT

MANIFEST = standalone.MANIFEST


class CollectError(UmbpSimError):
    """The output cannot be written (the dump itself never fails: missing files are listed)."""

    exit_code = EX_CANTCREAT


@dataclass
class CollectResult:
    path: str
    name: str
    collected: list[str] = field(default_factory=list)  # paths inside the dump
    missing: dict[str, str] = field(default_factory=dict)  # path -> why
    notes: list[str] = field(default_factory=list)


def collect(out: str, name: str | None = None, root: str = "/") -> CollectResult:
    """Write the dump tarball ``out`` (gzip if it ends in .gz/.tgz, bz2/xz likewise; ``-``:
    gzip to stdout). Anything at ``out`` but a regular file (a symbolic link, a directory, a
    device, a FIFO) is refused before collecting; a regular file is replaced atomically."""
    name = name or os.uname().nodename or "host"
    if not name or "/" in name or name in (".", ".."):
        raise CollectError(f"--name: {name!r} is not a usable directory name")
    _check(standalone.check_output, out)  # before any collecting work
    c = standalone.Collector(root, name)
    sizes: list[int] = standalone.collect_host(c, "/proc/self")
    cgroup = c.read("/proc/self/cgroup")  # unreadable: listed as missing (the script does not)
    mountinfo = c.read("/proc/self/mountinfo")
    c.missing.pop("proc/self/mountinfo", None)
    standalone.cgroup_limits(c, cgroup, mountinfo, sizes)
    standalone.add_manifest(c, "umbp-sim collect", standalone.host_arch(c))
    _check(standalone.write_output, out, standalone.tar_bytes(out, name, c.files))
    return CollectResult(out, name, c.collected, c.missing, c.notes)


def _check(step: Callable[..., object], *args: object) -> None:
    """The script's output check or safe write (stdout; else an O_EXCL temporary file moved
    into place; never over anything but a regular file), its OSError as CollectError."""
    try:
        step(*args)
    except OSError as e:
        raise CollectError(str(e)) from None
