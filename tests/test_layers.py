"""The package is a stack: nothing imports anything above it, counting the imports inside
functions and under ``if TYPE_CHECKING:`` (tests/import_graph.py). Bottom up: the vocabulary,
the host, the allocator surface, what a run is made of (dumps, sglang), the run engine, an
external allocator as a subject of it, the router that picks built-in or external, what is
built on runs (scenarios, replay, exploration, compare, exec), the commands.

A module in no layer fails the test: a new module is placed here, in ARCHITECTURE.md's table
too. Within the features layer some are kept apart (``APART``).
"""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest
from import_graph import graph

# Bottom up; a module is in the layer of its longest listed prefix (a package: all it holds).
STACK: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("vocabulary", (
        "umbp_sim._context", "umbp_sim.bindings", "umbp_sim.capi", "umbp_sim.collect_scripts",
        "umbp_sim.errors", "umbp_sim.progress", "umbp_sim.request", "umbp_sim.vocabulary",
    )),
    ("host", (
        "umbp_sim.faults", "umbp_sim.host", "umbp_sim.machine", "umbp_sim.sim",
        "umbp_sim.strategies",
    )),
    ("allocator", (
        "umbp_sim.allocator", "umbp_sim.allocator_spec", "umbp_sim.mori_compat",
        "umbp_sim.allocator_profiles",
    )),
    ("run inputs", ("umbp_sim.dump", "umbp_sim.sglang")),
    ("engine", ("umbp_sim.engine",)),
    ("external subject", ("umbp_sim.external",)),
    ("router", ("umbp_sim.run_router",)),
    ("features", (
        "umbp_sim.comparison", "umbp_sim.diagnose", "umbp_sim.exec_host", "umbp_sim.explore",
        "umbp_sim.html_page", "umbp_sim.scenario", "umbp_sim.toolchain",
    )),
    ("commands", (
        "umbp_sim.cli", "umbp_sim.live_dump", "umbp_sim.commands", "umbp_sim.pytest_plugin",
        # the scenario files a wheel installs, with their dump-trimming script
        "umbp_sim.scenarios",
    )),
)  # fmt: skip

_EXEC = ("umbp_sim.exec_host",)
_COMPARE = ("umbp_sim.comparison",)
# (importers, imported, why): features that stand side by side and borrow nothing of each other.
APART: tuple[tuple[tuple[str, ...], tuple[str, ...], str], ...] = (
    (("umbp_sim.diagnose",), ("umbp_sim.external",),
     "a run's timeout and no-room are the engine's outcomes (engine/record.py)"),
    (_COMPARE, ("umbp_sim.diagnose",),
     "compare's pages and replay's share the skeleton below both (umbp_sim/html_page.py)"),
    (_EXEC, _COMPARE,
     "exec's named machines are the host layer's (umbp_sim/host/named_machines.py)"),
)  # fmt: skip

# Deprecated aliases kept for scripts written against an older layout: the only imports that
# may run up, each from a module that warns when the alias is used (checked below).
DEPRECATED_ALIASES = {
    ("umbp_sim.engine", "umbp_sim.run_router"),
    ("umbp_sim.engine.dispatch", "umbp_sim.run_router"),
}


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_of(module: str) -> int | None:
    """The index in ``STACK`` of ``module``'s layer (its longest listed prefix), None if none."""
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for i, (_, prefixes) in enumerate(STACK):
        for p in prefixes:
            if _within(module, p) and (best is None or len(p) > best[0]):
                best = (len(p), i)
    return None if best is None else best[1]


def upward(imports: dict[str, dict[str, int]]) -> list[str]:
    """Every import that runs up the stack or between features kept apart, as
    ``importer:line -> imported (layer -> layer)``."""
    found = []
    for module, targets in sorted(imports.items()):
        low = layer_of(module)
        for target, line in sorted(targets.items()):
            high = layer_of(target)
            if low is None or high is None or (module, target) in DEPRECATED_ALIASES:
                continue
            if high > low:
                found.append(f"{module}:{line} -> {target} "
                             f"({STACK[low][0]} -> {STACK[high][0]})")  # fmt: skip
            for importers, imported, why in APART:
                if any(_within(module, p) for p in importers) and any(
                    _within(target, p) for p in imported
                ):
                    found.append(f"{module}:{line} -> {target} (kept apart: {why})")
    return found


def test_every_module_has_a_layer() -> None:
    unplaced = [m for m in graph() if m != "umbp_sim" and layer_of(m) is None]
    assert unplaced == []


def test_nothing_imports_up_the_stack() -> None:
    imports = graph()
    assert len(imports) > 100  # the whole package was read
    assert upward(imports) == []


def test_an_import_up_the_stack_or_across_features_kept_apart_is_found() -> None:
    # The engine core importing the router or an external subject, diagnose importing
    # external/, compare's pages importing diagnose/, exec borrowing compare's matrix: each
    # is reported, inside a function or not (the graph does not tell them apart).
    imports = {
        "umbp_sim.engine.execute": {"umbp_sim.run_router": 3, "umbp_sim.engine.spec": 4},
        "umbp_sim.engine.work": {"umbp_sim.external.runner": 9},
        "umbp_sim.diagnose.simulate": {
            "umbp_sim.external.runner": 23,
            "umbp_sim.engine.record": 20,
        },
        "umbp_sim.comparison.report_html": {"umbp_sim.diagnose.html_report": 22},
        "umbp_sim.exec_host.machine_dir": {"umbp_sim.comparison.matrix": 80},
        "umbp_sim.run_router": {"umbp_sim.external.observe": 20},  # down: fine
        "umbp_sim.engine": {"umbp_sim.run_router": 24},  # the deprecated alias
    }
    assert upward(imports) == [
        "umbp_sim.comparison.report_html:22 -> umbp_sim.diagnose.html_report (kept apart: "
        "compare's pages and replay's share the skeleton below both (umbp_sim/html_page.py))",
        "umbp_sim.diagnose.simulate:23 -> umbp_sim.external.runner (kept apart: a run's timeout "
        "and no-room are the engine's outcomes (engine/record.py))",
        "umbp_sim.engine.execute:3 -> umbp_sim.run_router (engine -> router)",
        "umbp_sim.engine.work:9 -> umbp_sim.external.runner (engine -> external subject)",
        "umbp_sim.exec_host.machine_dir:80 -> umbp_sim.comparison.matrix (kept apart: exec's "
        "named machines are the host layer's (umbp_sim/host/named_machines.py))",
    ]  # fmt: skip


@pytest.mark.parametrize("name", ["run", "open_allocator"])
def test_the_engine_names_of_the_router_are_deprecated_aliases(name: str) -> None:
    import umbp_sim.engine
    import umbp_sim.run_router

    with pytest.warns(DeprecationWarning, match=rf"^umbp_sim\.engine\.{name} is deprecated: "
                      rf"use umbp_sim\.run_router\.{name}$"):  # fmt: skip
        alias = getattr(umbp_sim.engine, name)
    assert alias is getattr(umbp_sim.run_router, name)


def test_the_old_router_module_is_a_deprecated_alias() -> None:
    import umbp_sim.run_router

    sys.modules.pop("umbp_sim.engine.dispatch", None)
    with pytest.warns(DeprecationWarning, match=r"^umbp_sim\.engine\.dispatch is deprecated: "
                      r"use umbp_sim\.run_router$"):  # fmt: skip
        old = importlib.import_module("umbp_sim.engine.dispatch")
    for name in umbp_sim.run_router.__all__:
        assert getattr(old, name) is getattr(umbp_sim.run_router, name)


def test_the_engine_names_its_own_run_vocabulary_without_a_warning() -> None:
    import umbp_sim.engine

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert umbp_sim.engine.Run.__module__ == "umbp_sim.engine.spec"
        assert umbp_sim.engine.RunRecord.__module__ == "umbp_sim.engine.record"


def test_a_run_s_admin_writes_are_data_the_engine_applies() -> None:
    # Effects on the host go down as values (PoolWrite, sent field by field to an external
    # build's server), never as a function of an upper layer for the engine to call.
    from umbp_sim import Machine
    from umbp_sim.engine.execute import execute
    from umbp_sim.engine.host_changes import PoolWrite
    from umbp_sim.engine.spec import Alloc, Run
    from umbp_sim.engine.subject import BuiltinSubject
    from umbp_sim.request import AllocRequest

    m = Machine.x86_64(nodes=2, mem_per_node="8GiB")
    work = Alloc(AllocRequest(4 << 20, "AnonymousHugetlb", numa_node=1))
    write = PoolWrite("nr_hugepages", 2 << 20, 64, 1)
    assert not callable(write)
    rec = execute(
        Run(m, work, changes=(write,), counters=("node1.hugepages.2MiB.total",)),
        BuiltinSubject("umbp-sim"),
    )
    assert (rec.outcome, rec.counters) == ("ok", {"node1.hugepages.2MiB.total": 64})

    def callback(host: object) -> None:
        raise AssertionError("the engine called a function it was handed")

    with pytest.raises(TypeError, match=r"^an admin write is a PoolWrite \(data\), not a "
                       r"function$"):  # fmt: skip
        execute(Run(m, work, changes=(callback,)), BuiltinSubject("umbp-sim"))  # type: ignore[arg-type]


def test_no_two_modules_share_a_name() -> None:
    # One meaning per name: a module is found by its name alone (packages count; the command
    # modules under umbp_sim/commands/ are named as their commands, so nothing else is).
    names: dict[str, list[str]] = {}
    for module in graph():
        if module != "umbp_sim":
            names.setdefault(module.rsplit(".", 1)[-1], []).append(module)
    shared = {name: sorted(mods) for name, mods in names.items() if len(mods) > 1}
    assert len(names) > 100 and shared == {}
