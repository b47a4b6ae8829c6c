"""SimKernel's reason rules are declared once (``UMBP_SIM_REASON_RULES`` in
csrc/kernel/reason_rules.h): C++ records a reason only under a declared rule (an enum: an
undeclared id does not compile) and only with the numbers the rule declares, in its order (a
logic_error otherwise); Python reads the table as ``_native.REASON_RULES``. Every rule id
umbp_sim's own code compares a reason against is held to that table here, from the source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import umbp_sim
from umbp_sim import _native
from umbp_sim.machine import Machine
from umbp_sim.sim import SimHost

PACKAGE = Path(umbp_sim.__file__).resolve().parent
RULES = _native.REASON_RULES


def is_rule(node: ast.AST) -> bool:
    """``x.rule`` or a variable named ``rule``."""
    return (isinstance(node, ast.Attribute) and node.attr == "rule") or (
        isinstance(node, ast.Name) and node.id == "rule"
    )


def constants(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for e in node.elts for s in constants(e)]
    return []


def rule_ids_in_source() -> dict[str, list[str]]:
    """{"file:line": [ids]} of every rule id umbp_sim compares a reason's rule against: ``==``,
    ``!=``, ``in`` with ``.rule`` or ``rule``; ``.rule.startswith(...)`` (as "prefix*");
    ``_last(run, ID)`` (diagnose/hypotheses.py); tuples assigned to ``rules``."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            ids: list[str] = []
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(is_rule(s) for s in sides):
                    ids = [c for s in sides if not is_rule(s) for c in constants(s)]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr == "startswith" and is_rule(node.func.value):
                    ids = [f"{c}*" for a in node.args for c in constants(a)]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                if node.func.id == "_last" and len(node.args) == 2:
                    ids = constants(node.args[1])
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == "rules" for t in targets):
                    ids = constants(node.value) if node.value is not None else []
            if ids:
                found[f"{path.relative_to(PACKAGE)}:{node.lineno}"] = ids
    return found


def test_the_table_has_each_rule_once_with_its_meaning() -> None:
    assert len(RULES) >= 20
    for rule, (numbers, meaning) in RULES.items():
        assert rule.isidentifier() and meaning, rule
        assert len(numbers) == len(set(numbers)), rule


def test_every_rule_umbp_sim_compares_against_is_declared() -> None:
    found = rule_ids_in_source()
    assert len(found) >= 25  # the scan sees diagnose/'s comparisons
    wrong = {}
    for where, ids in found.items():
        bad = [
            i for i in ids
            if not (any(r.startswith(i[:-1]) for r in RULES) if i.endswith("*") else i in RULES)
        ]  # fmt: skip
        if bad:
            wrong[where] = bad
    assert wrong == {}


def test_every_declared_rule_is_recorded_somewhere_in_simkernel() -> None:
    """No rule sits in the table that no SimKernel code records (a stale entry)."""
    csrc = Path(__file__).resolve().parent.parent / "csrc" / "kernel"  # the repository's
    assert csrc.is_dir(), csrc
    source = "".join(p.read_text() for p in sorted(csrc.glob("sim_*.cpp")))
    unused = [r for r in RULES if f"ReasonRule::{r}" not in source]
    assert unused == []


@pytest.mark.parametrize(
    ("rule", "numbers", "problem"),
    [
        ("rlimit_as", [("vm", 1), ("length", 2), ("limit", 3)], ""),
        ("rlimit_as", [("length", 2)], ""),
        ("rlimit_as", [("limit", 3), ("vm", 1)], "rule rlimit_as: number vm is not one"),
        ("rlimit_as", [("pages", 1)], "rule rlimit_as: number pages is not one"),
        ("no_such_rule", [], "rule no_such_rule is not in UMBP_SIM_REASON_RULES"),
    ],
)
def test_a_reason_with_numbers_its_rule_does_not_declare_is_refused(
    rule: str, numbers: list[tuple[str, int]], problem: str
) -> None:
    assert _native.reason_numbers_problem(rule, numbers).startswith(problem)
    assert bool(problem) == bool(_native.reason_numbers_problem(rule, numbers))


def test_reasons_simkernel_records_carry_their_rules_numbers() -> None:
    """A hugetlb mmap that cannot reserve, on a host without a pool: the recorded reason is
    a declared rule with numbers it declares (the check at record time let it through)."""
    host = SimHost(Machine.build(nodes=1, mem_per_node="8GiB"))
    k = host.kernel
    r = k.mmap(0, 4 << 20, 3, 0x22 | 0x40000, -1, 0)  # MAP_PRIVATE|MAP_ANONYMOUS|MAP_HUGETLB
    assert r.error
    reasons = host.reasons()
    assert reasons and all(x.rule in RULES for x in reasons)
    last = reasons[-1]
    assert last.rule == "hugetlb_reserve" and last.errno == "ENOMEM"
    assert list(last.numbers) == list(RULES["hugetlb_reserve"][0])
