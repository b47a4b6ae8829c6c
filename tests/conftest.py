"""Fixtures for tests that run on the real kernel (CI is root on Linux)."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from umbp_sim import _native
from umbp_sim.vocabulary._lsan import import_untracked, lsan_active

# Tests start `python -c` children from the repository root, where the source tree's umbp_sim/
# (which has no compiled _native) would shadow the installed package: keep cwd off their
# sys.path (Python >= 3.11).
os.environ["PYTHONSAFEPATH"] = "1"


# Under `tox -e asan`: numpy's and torch's import leaks are not umbp-sim's
# (umbp_sim/vocabulary/_lsan.py).
if lsan_active():
    import_untracked("numpy", "torch")

pytest_plugins = ["pytester"]  # tests of the umbp_sim pytest plugin run pytest in a subprocess

HUGEPAGES_SYSFS = Path("/sys/kernel/mm/hugepages")


def isolated_child_env() -> dict[str, str]:
    """The environment for a ``python -I`` child (the stand-alone collect.py). Under ``tox -e
    asan`` such a child ignores run.py's PYTHONMALLOC=malloc (-I drops PYTHON* variables), so
    LeakSanitizer cannot see the pointers pymalloc holds and reports CPython's own objects (exit
    1 after a normal run): leak checking is off for it."""
    env = dict(os.environ)
    if "ASAN_OPTIONS" in env:
        env["ASAN_OPTIONS"] += ":detect_leaks=0"
    return env


# A test run started in the background of a non-interactive shell (`cmd &`, nohup) inherits
# SIGINT ignored, and so would every command the tests start: the tests of Ctrl-C would then
# see commands that cannot be interrupted. The commands get it at its default, as a terminal's
# foreground job has it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _load_hugepage_state():  # type: ignore[no-untyped-def]
    # tools/ is not a package (and .ci/run runs the file before anything is installed).
    path = Path(__file__).resolve().parent.parent / "tools" / "hugepage_state.py"
    spec = importlib.util.spec_from_file_location("umbp_sim_hugepage_state", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# Hugepage pools are host-wide: tests that set them (in xdist workers, or other checkouts on the
# same host) take this lock for their whole duration, and record the originals beside it first,
# so a killed run is undone by the next one (tools/hugepage_state.py).
hugepage_state = _load_hugepage_state()
POOL_LOCK = hugepage_state.LOCK


def pytest_sessionstart(session: pytest.Session) -> None:
    """A previous run killed mid-test left a pool changed: put it back before anything runs."""
    if os.geteuid() != 0 or not os.path.lexists(hugepage_state.RECORD):
        return
    try:
        lines = hugepage_state.restore_stale()
    except hugepage_state.StateError as e:
        raise pytest.UsageError(f"hugepage pools: {e}") from None
    for line in lines:
        print(f"umbp-sim tests: {line}", file=sys.stderr)


# ---- tiers ------------------------------------------------------------------------------------
# The default run (`pytest`, the README's test command) leaves the host alone: the tiers below
# are deselected by pyproject's addopts and run by their own tox environments (CI runs them all,
# as root). A test that uses the nr_hugepages fixture is in the realkernel tier wherever it is.
TIER_FIXTURES = {"nr_hugepages": "realkernel"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for fixture, marker in TIER_FIXTURES.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)


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


def require_root(what: str) -> None:
    """Skip (with the reason) where this test cannot do what it needs: change host sysctls."""
    if os.geteuid() != 0:
        pytest.skip(f"needs root: {what} (the realkernel tier; CI runs it as root)")


@pytest.fixture
def pools_still() -> Iterator[None]:
    """The host's hugepage pools stay as they are while the test runs: the pool lock, which
    every test that changes a pool holds. A user who is not root runs none of those, and
    cannot change a pool either, so there is nothing to wait for."""
    if os.geteuid() != 0:
        yield
        return
    with hugepage_state.locked():
        yield


@pytest.fixture
def nr_hugepages() -> Iterator[Callable[..., int]]:
    """Set the hugepage pool of one size (default 2048 kB = vm.nr_hugepages); returns what the
    kernel actually gave. Holds the pool lock for the whole test; before the first change every
    pool knob is recorded beside the lock, and a finalizer that runs even when the test fails
    restores them (failing the test if pages stay allocated: a leaked mapping). If the run is
    killed instead, the next session start or fixture restores the record."""
    require_root("sets vm.nr_hugepages")
    with hugepage_state.locked():
        stale = hugepage_state.restore_stale_locked()  # a run killed while holding the lock
        if len(stale) > 1:
            pytest.fail("; ".join(stale))
        recorded = False

        def set_pool(count: int, size_kb: int = 2048) -> int:
            nonlocal recorded
            path = HUGEPAGES_SYSFS / f"hugepages-{size_kb}kB" / "nr_hugepages"
            if not recorded:  # every pool knob, before the first change
                hugepage_state.write_record(hugepage_state.snapshot())
                recorded = True
            path.write_text(f"{count}\n")
            return int(path.read_text())

        try:
            yield set_pool
        finally:
            problems = []
            if recorded:
                values = hugepage_state.read_record() or {}
                problems = hugepage_state.restore(values)
                if not problems:
                    hugepage_state.remove_record()
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


def session_processes(sid: int) -> list[int]:
    """Live processes of session ``sid`` (a command started in a new session and everything it
    started; a zombie is not live: where init does not reap, it stays)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:  # state, ppid, pgrp, session
            out.append(int(entry))
    return out


# mori.umbp's Python surface for the allocators the tests write as Python modules: the backing
# enum and a handle over an mmap.mmap (the module imports ctypes and enum; no braces, so that a
# str.format template can take it as a field).
MORI_SURFACE = """
class UMBPHostBufferBacking(enum.Enum):
    Anonymous = 0
    AnonymousHugetlb = 1
    Shm = 2
    ShmHugetlb = 3


class Handle:
    def __init__(self, m, size):
        self._m = m
        self.ptr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        self.requested_size = size
        self.mapped_size = len(m)
        self.actual_backing = UMBPHostBufferBacking.Anonymous
        self.actual_alignment = 4096

    def __bool__(self):
        return self.ptr != 0
"""
