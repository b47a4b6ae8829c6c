"""The public API's docstrings (issue 18, item 8): every strategy, fixture and FaultPlan method
has an example, and every example runs. The API reference itself is built by `tox -e docs`."""

from __future__ import annotations

import doctest
import inspect
import re
from pathlib import Path

import pytest

import umbp_sim
from umbp_sim import faults, machine, progress, pytest_plugin, request, strategies
from umbp_sim.diagnose import html_report, picture

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
STRATEGIES = [strategies.machines, strategies.fault_plans, strategies.alloc_requests,
              strategies.AllocRequest]  # fmt: skip
FIXTURES = ["sim_host", "fault_plan", "umbp_allocator"]
FAULT_PLAN_METHODS = ["from_rules", "from_dict", "to_dict", "from_toml", "to_toml",
                      "native_rules", "wrap"]  # fmt: skip


def _fixture_doc(name: str) -> str:
    fn = getattr(pytest_plugin, name)
    fn = getattr(fn, "__wrapped__", getattr(fn, "_fixture_function", fn))
    return inspect.getdoc(fn) or ""


def test_every_strategy_and_faultplan_method_has_a_doctest_example() -> None:
    objects = [*STRATEGIES, umbp_sim.FaultPlan]
    objects += [getattr(umbp_sim.FaultPlan, m) for m in FAULT_PLAN_METHODS]
    missing = [o.__qualname__ for o in objects if ">>> " not in (inspect.getdoc(o) or "")]
    assert missing == []


@pytest.mark.parametrize(
    "module", [strategies, request, faults, machine, progress, picture, html_report]
)
def test_doctests_pass(module: object) -> None:
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False)  # type: ignore[arg-type]
    assert result.attempted > 0
    assert result.failed == 0


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_example_runs_as_a_test(pytester: pytest.Pytester, name: str) -> None:
    doc = _fixture_doc(name)
    blocks = re.findall(r"```python\n(.*?)```", doc, re.S)
    assert len(blocks) == 1, f"{name}: one ```python example in its docstring"
    pytester.makepyfile(**{f"test_{name}_example": blocks[0]})
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_the_package_is_typed() -> None:
    assert (Path(umbp_sim.__file__).parent / "py.typed").is_file()
