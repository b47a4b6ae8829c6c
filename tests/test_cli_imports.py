"""The CLI starts without the simulator (issue 17, item 5): ``umbp-sim --help``, ``--version``,
a usage error and every command's ``--help`` import neither the compiled extension nor torch,
and the top level imports no command at all. Measured in fresh child processes (this test
process has imported everything already); bench/bench_cli_startup.py times it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from umbp_sim import cli

HEAVY = ("umbp_sim._native", "torch", "numpy")

# Runs each argv through cli.main in a fresh interpreter, then reports which heavy modules and
# which umbp_sim modules are loaded, and the exit status.
CHILD = """
import contextlib, io, json, sys
from umbp_sim.cli import main
argv = json.loads(sys.argv[1])
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
heavy = [m for m in json.loads(sys.argv[2]) if m in sys.modules]
ours = sorted(m for m in sys.modules if m.startswith("umbp_sim"))
print(json.dumps({"code": code, "heavy": heavy, "ours": ours, "out": out.getvalue()}))
"""


def child(argv: list[str]) -> dict:
    env = {**os.environ, "PYTHONSAFEPATH": "1"}  # the installed package, not the source tree
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(argv), json.dumps(HEAVY)],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize(
    ("argv", "code"),
    [(["--help"], 0), (["--version"], 0), ([], 64), (["no-such-command"], 64), (["-x"], 64)],
    ids=["help", "version", "no-command", "unknown-command", "unknown-flag"],
)
def test_the_top_level_imports_no_command(argv: list[str], code: int) -> None:
    r = child(argv)
    assert r["code"] == code, r["out"]
    assert r["heavy"] == []
    assert r["ours"] == [
        "umbp_sim",
        "umbp_sim.cli",
        "umbp_sim.errors",
        "umbp_sim.vocabulary",
        "umbp_sim.vocabulary.exit_codes",
    ]


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_a_commands_help_and_usage_errors_load_no_extension(name: str) -> None:
    helped = child([name, "--help"])
    assert helped["code"] == 0 and helped["out"].startswith(f"usage: umbp-sim {name} ")
    bad = child([name, "--no-such-flag"])
    assert bad["code"] == 64 and "error: " in bad["out"]
    for r in (helped, bad):
        assert r["heavy"] == [], r["heavy"]
        # only this command's module, none of the others'
        commands = {m.rsplit(".", 1)[1] for m in r["ours"] if m.startswith("umbp_sim.commands.")}
        assert commands == {cli.COMMANDS[name].module}


def test_every_command_gets_its_options_when_it_runs() -> None:
    # The parser of a run has the selected command's options only; argv=None builds them all.
    full = cli.build_parser()
    lazy = cli.build_parser(["inspect", "x"])
    sub = {a.dest: a for a in full._actions}["command"]
    lazy_sub = {a.dest: a for a in lazy._actions}["command"]
    assert list(sub.choices) == list(lazy_sub.choices) == list(cli.COMMANDS)
    for name, p in sub.choices.items():
        assert p.description == cli.COMMANDS[name].help
        assert p.get_default("_run") is not None
        assert (lazy_sub.choices[name].get_default("_run") is not None) is (name == "inspect")
    assert cli.selected_command(["--help", "replay"]) is None  # the top level answers
    assert cli.selected_command(["replay", "--help"]) == "replay"
    assert cli.selected_command(["nope"]) is None


# A command's --help builds that command's parser only: the request's flags of replay and
# preflight (umbp_sim/diagnose/request_flags.py) and nothing they do once run. Before the lazy
# packages (umbp_sim.dump, umbp_sim.sglang, umbp_sim.diagnose): 31 umbp_sim modules (199 in all,
# importlib.metadata among them) for `replay --help`; then 17 (127), the statuses cli.py names
# among them; 18 since those live in a folder of their own (umbp_sim.vocabulary: an empty
# package module, its docstring).
HELP_BOUND = 18
NOT_FOR_HELP = (
    "importlib.metadata",
    "umbp_sim.diagnose.replay_request",
    "umbp_sim.dump.facts",
    "umbp_sim.dump.to_machine",
    "umbp_sim.scenario.schema",
    "umbp_sim.sglang.sizing",
)
HELP_CHILD = CHILD.replace(
    "heavy = [m for m in json.loads(sys.argv[2]) if m in sys.modules]",
    "heavy = [m for m in json.loads(sys.argv[2]) if m in sys.modules]\n"
    "heavy += [m for m in json.loads(sys.argv[3]) if m in sys.modules]",
)


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_a_commands_help_imports_only_its_parser(name: str) -> None:
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", HELP_CHILD, json.dumps([name, "--help"]), json.dumps(HEAVY),
         json.dumps(NOT_FOR_HELP)],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["code"] == 0
    assert r["heavy"] == []
    assert len(r["ours"]) <= HELP_BOUND, r["ours"]


@pytest.mark.parametrize("package", ["umbp_sim.dump", "umbp_sim.sglang", "umbp_sim.diagnose"])
def test_lazy_exports_are_what_mypy_is_shown(package: str) -> None:
    # A lazy package names each export once, under `if TYPE_CHECKING:` (what mypy types), and
    # __getattr__ imports what those lines name: each name resolves to the object its submodule
    # holds, __all__ lists it, and a name not there is an AttributeError.
    import ast
    import importlib

    pkg = importlib.import_module(package)
    tree = ast.parse(open(pkg.__file__, encoding="utf-8").read())
    typed: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            for imp in node.body:
                if isinstance(imp, ast.ImportFrom) and imp.module.startswith(package + "."):
                    for alias in imp.names:
                        typed[alias.asname or alias.name] = imp.module.removeprefix(package + ".")
    assert len(typed) >= 7
    assert set(typed) <= set(pkg.__all__)
    for name, module in typed.items():
        held = getattr(importlib.import_module(f"{package}.{module}"), name)
        assert getattr(pkg, name) is held, name
    assert not hasattr(pkg, "no_such_name")
