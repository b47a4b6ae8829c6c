"""Fixtures for tests that run on the real kernel (CI is root on Linux)."""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from umbp_sim import _native

# Tests start `python -c` children from the repository root, where the source tree's umbp_sim/
# (which has no compiled _native) would shadow the installed package: keep cwd off their
# sys.path (Python >= 3.11).
os.environ["PYTHONSAFEPATH"] = "1"

pytest_plugins = ["pytester"]  # tests of the umbp_sim pytest plugin run pytest in a subprocess

HUGEPAGES_SYSFS = Path("/sys/kernel/mm/hugepages")
# Hugepage pools are host-wide: tests that set them (in xdist workers, or other checkouts on the
# same host) take this lock for their whole duration.
POOL_LOCK = "/tmp/umbp-sim-hugepage-pool.lock"


def hugepage_counters(size_kb: int = 2048) -> dict[str, int]:
    """total/free/reserved/surplus pages of one hugepage size, as sysfs reports them."""
    d = HUGEPAGES_SYSFS / f"hugepages-{size_kb}kB"
    read = lambda name: int((d / name).read_text())  # noqa: E731
    return {
        "total": read("nr_hugepages"),
        "free": read("free_hugepages"),
        "reserved": read("resv_hugepages"),
        "surplus": read("surplus_hugepages"),
    }


def meminfo_hugepages() -> dict[str, int]:
    """HugePages_Total/Free/Rsvd/Surp of /proc/meminfo (the default hugepage size)."""
    text = Path("/proc/meminfo").read_text()
    out = {}
    for key in ("HugePages_Total", "HugePages_Free", "HugePages_Rsvd", "HugePages_Surp"):
        m = re.search(rf"^{key}:\s+(\d+)$", text, re.M)
        assert m, f"/proc/meminfo has no {key} line"
        out[key] = int(m.group(1))
    return out


@pytest.fixture
def nr_hugepages() -> Iterator[Callable[..., int]]:
    """Set the hugepage pool of one size (default 2048 kB = vm.nr_hugepages); returns what the
    kernel actually gave. Every size touched is restored in a finalizer that runs even when the
    test fails, and the finalizer fails the test if pages stay allocated (a leaked mapping)."""
    if os.geteuid() != 0:
        pytest.fail("tests that set nr_hugepages must run as root (CI does)")
    saved: dict[Path, int] = {}
    lock = open(POOL_LOCK, "a")  # noqa: SIM115 - held until the finalizer
    fcntl.flock(lock, fcntl.LOCK_EX)

    def set_pool(count: int, size_kb: int = 2048) -> int:
        path = HUGEPAGES_SYSFS / f"hugepages-{size_kb}kB" / "nr_hugepages"
        if path not in saved:
            saved[path] = int(path.read_text())
        path.write_text(f"{count}\n")
        return int(path.read_text())

    try:
        yield set_pool
    finally:
        problems = []
        for path, old in saved.items():
            path.write_text(f"{old}\n")
            now = int(path.read_text())
            if now != old:
                problems.append(f"{path} is {now} after restoring {old} (pages still in use?)")
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()
        if problems:
            pytest.fail("; ".join(problems))


@pytest.fixture
def linux_kernel() -> object:
    """A fresh LinuxKernel: its own once-only warnings, its own buffer tables."""
    return _native.LinuxKernel()


def proc_maps() -> list[str]:
    return Path("/proc/self/maps").read_text().splitlines()


def mapping_of(addr: int) -> str | None:
    """The /proc/self/maps line of the mapping containing addr, or None."""
    for line in proc_maps():
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo <= addr < hi:
            return line
    return None
