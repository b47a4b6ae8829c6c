"""pytest plugin: the ``sim_host`` fixture, a simulated host with a fake /proc and /sys.

``sim_host`` yields a ``umbp_sim.sim.SimHost`` inside an active ``simulate()`` context (so
``UMBPHostMemAllocator()`` created in the test runs on it) and a pyfakefs filesystem in which
every rendered /proc and /sys file exists. The fake files are *live*: each read renders the
file from the SimKernel's current state, so Python code reading /proc/meminfo after an
allocation or ``host.set_nr_hugepages(...)`` sees the new counters without any sync call.

Which machine (first match wins):
  - indirect parametrisation: ``@pytest.mark.parametrize("sim_host", [m1, m2], indirect=True)``
    with ``Machine`` instances;
  - ``@pytest.mark.machine(machine)`` with a ``Machine``, or ``@pytest.mark.machine(**kw)`` with
    keywords for ``Machine.build`` (``hugepages={"2MiB": 8}``, ``nodes=2`` ...);
  - otherwise ``DEFAULT_MACHINE()``: x86_64, one 16 GiB node, 512 x 2 MiB pages.

With ``UMBP_SIM_FORBID_SKIPS=1`` in the environment a session that skipped any test fails,
listing each skip with its reason: in a CI that has every prerequisite, a skipped scenario or
test is a missing check (umbp-sim's own CI sets it).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from umbp_sim.machine import Machine
from umbp_sim.scenario.schema import MARKER_KEY, TomlError, read_toml
from umbp_sim.sim import SimHost, simulate


def DEFAULT_MACHINE() -> Machine:  # noqa: N802 - a constant-like factory
    """The host ``sim_host`` simulates without a ``machine`` marker: x86_64, one 16 GiB node,
    512 x 2 MiB pages."""
    return Machine.x86_64(hugepages={"2MiB": 512})


def pytest_configure(config: pytest.Config) -> None:
    """Registers the ``machine`` marker (``@pytest.mark.machine(nodes=2, ...)``)."""
    config.addinivalue_line(
        "markers", "machine(machine=None, **build_kw): the Machine the sim_host fixture simulates"
    )


def _machine_for(request: pytest.FixtureRequest) -> Machine:
    param = getattr(request, "param", None)
    if isinstance(param, Machine):
        return param
    marker = request.node.get_closest_marker("machine")
    if marker is not None:
        if marker.args and isinstance(marker.args[0], Machine):
            return marker.args[0]
        return Machine.build(**marker.kwargs)
    return DEFAULT_MACHINE()


def _live_file_class() -> type:
    from pyfakefs.fake_file import FakeFile

    class LiveFile(FakeFile):  # type: ignore[misc]
        """A fake file whose contents are rendered on every read."""

        def __init__(self, name: str, filesystem: Any, render: Callable[[], bytes]) -> None:
            super().__init__(name, filesystem=filesystem)
            self.__dict__["_render"] = render

        @property
        def byte_contents(self) -> bytes:
            return self._render()

        @property
        def st_size(self) -> int:  # type: ignore[override]
            return len(self._render())

        @property  # type: ignore[misc]
        def size(self) -> int:  # type: ignore[override]
            return len(self._render())

        def is_large_file(self) -> bool:
            return False

    return LiveFile


def install_files(fs: Any, host: SimHost) -> None:
    """Lay ``host``'s rendered files into the pyfakefs filesystem ``fs`` as live files."""
    live = _live_file_class()
    for path in sorted(host.files()):
        parent, name = os.path.split(path)
        if fs.exists(path):
            fs.remove_object(path)
        if not fs.exists(parent):
            fs.create_dir(parent)

        def render(p: str = path) -> bytes:
            return host.read(p).encode()

        fs.add_object(parent, live(name, fs, render))


@pytest.fixture
def sim_host(request: pytest.FixtureRequest, fs: Any) -> Iterator[SimHost]:
    """A simulated host (see the module docstring) with live fake /proc and /sys files.

    ```python
    import pytest
    from umbp_sim import UMBPHostMemAllocator, UMBPHostBufferBacking as B

    @pytest.mark.machine(nodes=2, hugepages_per_node=[{"2MiB": 64}, {}])
    def test_pool_on_node0(sim_host):
        alloc = UMBPHostMemAllocator()  # runs on sim_host
        h = alloc.alloc(64 << 20, B.AnonymousHugetlb, numa_node=0)
        assert h.actual_backing == B.AnonymousHugetlb
        assert sim_host.node_hugepages(0, 2 << 20).free == 32
        assert "HugePages_Free:       32" in open("/proc/meminfo").read()
        alloc.free(h)
    ```
    """
    with simulate(_machine_for(request)) as host:
        install_files(fs, host)
        yield host


@pytest.fixture
def fault_plan() -> Callable[..., Any]:
    """A factory: ``fault_plan({"op": "mmap", "errno": "ENOMEM", "nth": 1}, ..., seed=0)``
    returns a ``FaultPlan``; ``plan.wrap(kernel)`` puts it over any kernel.

    ```python
    from umbp_sim import UMBPHostMemAllocator, UMBPHostBufferBacking as B

    def test_populate_efault_demotes(sim_host, fault_plan):
        plan = fault_plan({"op": "madvise", "advice": "MADV_POPULATE_WRITE", "errno": "EFAULT"})
        alloc = UMBPHostMemAllocator(kernel=plan.wrap(sim_host.kernel))
        h = alloc.alloc(4 << 20, B.AnonymousHugetlb)
        assert h.actual_backing == B.Anonymous
        alloc.free(h)
    ```
    """
    from umbp_sim.faults import FaultPlan

    def make(*rules: dict[str, Any], seed: int = 0) -> FaultPlan:
        return FaultPlan.from_rules(list(rules), seed)

    return make


@pytest.fixture
def umbp_allocator(sim_host: SimHost) -> Iterator[Any]:
    """A ``UMBPHostMemAllocator`` on ``sim_host`` behind a TracingKernel; at teardown it must
    have freed everything (no mapping, fd, shm entry or hugepage reservation left).

    ```python
    from umbp_sim import UMBPHostBufferBacking as B

    def test_shm_buffer_is_freed(umbp_allocator):
        h = umbp_allocator.alloc(2 << 20, B.AnonymousShm)
        assert h and h.actual_backing == B.AnonymousShm
        umbp_allocator.free(h)  # without this line the test fails at teardown: a leak
    ```
    """
    from umbp_sim.allocator import UMBPHostMemAllocator
    from umbp_sim.host.leaks import assert_no_leaks
    from umbp_sim.host.trace import instrument

    stack = instrument(sim_host.kernel)
    allocator = UMBPHostMemAllocator(kernel=stack.kernel)
    yield allocator
    if sim_host.crash is None:
        assert_no_leaks(allocator, stack.kernel, sim_host)


# ---- scenario files: `pytest scenarios/` collects each .toml as a test ----------------------
# Only files that are umbp-sim scenarios: the plugin is active in every pytest session of an
# environment where umbp-sim is installed, and other projects have .toml files of their own
# (even a scenarios/load.toml). A file is collected when it declares itself
# (`umbp_sim_scenario = 1` as a top-level key, first line by convention) or lies under a folder
# named by the `umbp_sim_scenarios` ini option.
INI_FOLDERS = "umbp_sim_scenarios"
_MARKER_LINE = re.compile(rb"^[ \t]*umbp_sim_scenario[ \t]*=", re.MULTILINE)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """With ``UMBP_SIM_FORBID_SKIPS=1``: fail a session that skipped anything, naming each."""
    if os.environ.get("UMBP_SIM_FORBID_SKIPS") != "1":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    stats = reporter.stats if reporter is not None else {}
    skipped = [r for r in stats.get("skipped", []) if not hasattr(r, "wasxfail")]
    if not skipped:
        return
    lines = [
        f"  {r.nodeid}: {r.longrepr[2] if isinstance(r.longrepr, tuple) else r.longrepr}"
        for r in skipped
    ]
    print(f"\nUMBP_SIM_FORBID_SKIPS=1: {len(skipped)} skipped, each a missing test:", *lines,
          sep="\n", file=sys.stderr)  # fmt: skip
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_addoption(parser: pytest.Parser) -> None:
    """Adds the ``umbp_sim_scenarios`` ini option: folders whose .toml files are scenarios.

    ```toml
    [tool.pytest.ini_options]
    umbp_sim_scenarios = ["tests/scenarios"]
    ```
    """
    parser.addini(
        INI_FOLDERS,
        type="paths",
        default=[],
        help="folders whose *.toml files are umbp-sim scenarios (relative to the ini file); "
        f"elsewhere only .toml files with a top-level `{MARKER_KEY} = 1` are collected",
    )


def declares_scenario(path: Path) -> bool:
    """True if the TOML file at ``path`` has the top-level marker key ``umbp_sim_scenario``.

    A file that has the marker line but is not valid TOML also counts (the run then reports
    the TOML error on it); a file without the line is never parsed.

    >>> import tempfile, pathlib
    >>> f = pathlib.Path(tempfile.mkdtemp()) / "s.toml"
    >>> _ = f.write_text('umbp_sim_scenario = 1\\n[scenario]\\nname = "s"\\n')
    >>> declares_scenario(f)
    True
    """
    try:
        data = path.read_bytes()
    except OSError:
        return False
    if not _MARKER_LINE.search(data):
        return False
    try:
        doc = read_toml(data.decode("utf-8"))
    except (UnicodeDecodeError, TomlError):  # nested past the recursion limit too: one test
        return True
    return MARKER_KEY in doc


def _in_scenario_folder(config: pytest.Config, file_path: Path) -> bool:
    folders = config.getini(INI_FOLDERS)
    return any(file_path.is_relative_to(Path(folder)) for folder in folders)


def pytest_collect_file(parent: pytest.Collector, file_path: Path) -> pytest.Collector | None:
    """Collects a .toml file as one scenario test if it declares itself
    (``umbp_sim_scenario = 1``) or lies under an ``umbp_sim_scenarios`` folder; other files
    are left to other plugins."""
    if file_path.suffix != ".toml":
        return None
    if _in_scenario_folder(parent.config, file_path) or declares_scenario(file_path):
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


class ScenarioFailed(Exception):
    """A scenario's outcome differed from its [expect] table."""


class ScenarioFile(pytest.File):
    def collect(self) -> Iterator[pytest.Item]:
        item = ScenarioItem.from_parent(self, name=self.path.stem)
        if _request_kind(self.path) == "sglang":
            item.add_marker(pytest.mark.torch)  # sglang's startup makes torch tensors
        yield item


def _request_kind(path: Any) -> str | None:
    """[request].kind of a scenario file, None if it cannot be read (the run reports why)."""
    try:
        with open(path, "rb") as f:
            kind = read_toml(f.read().decode("utf-8")).get("request", {}).get("kind")
    except (OSError, ValueError, AttributeError):  # TomlError, UnicodeDecodeError are ValueErrors
        return None
    return kind if isinstance(kind, str) else None


class ScenarioItem(pytest.Item):
    def runtest(self) -> None:
        from umbp_sim.scenario.scenario_run import run_scenario
        from umbp_sim.scenario.schema import load_scenario

        # an umbp_sim_scenarios folder is the tree its scenarios' dumps may be in
        folders = [Path(f) for f in self.config.getini(INI_FOLDERS)]
        root = next((f for f in folders if self.path.is_relative_to(f)), None)
        result = run_scenario(load_scenario(self.path, root))
        if not result.passed:
            raise ScenarioFailed(result.report())

    def repr_failure(self, excinfo: Any, style: Any = None) -> str:  # type: ignore[override]
        from umbp_sim.errors import UmbpSimError

        if isinstance(excinfo.value, (ScenarioFailed, UmbpSimError)):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"scenario {self.path.name}"
