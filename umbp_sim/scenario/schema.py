"""Scenario files: one simulated host, its faults, one request, the outcome that must follow.

Loading checks every key against the types below (``umbp_sim.vocabulary.value_types``; the
``[machine]`` keys' types are declared with the Machine fields, ``[[faults]]`` by ``FaultRule``): an
unknown key, a wrong type or a value beyond the simulator is a ``ScenarioError`` naming the file and
the key (``scenarios/x.toml: [machine].nodes: expected an integer, got a string ('2')``), before
anything runs. ``umbp_sim.scenario.scenario_run`` runs it.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from umbp_sim.allocator_profiles import MORI_LOG_ENV
from umbp_sim.errors import UmbpSimError
from umbp_sim.machine import SCENARIO_MACHINE_KEYS, SCENARIO_MACHINE_TYPES
from umbp_sim.scenario.regex import pattern_problem
from umbp_sim.sglang.release import SGLANG_RELEASES
from umbp_sim.vocabulary.backing import BACKINGS, OUTCOMES
from umbp_sim.vocabulary.bounded import shown
from umbp_sim.vocabulary.exit_codes import EX_DATAERR
from umbp_sim.vocabulary.toml_text import TomlError, read_toml
from umbp_sim.vocabulary.value_types import (
    MAX_BYTES,
    MAX_INT,
    Array,
    Bool,
    Custom,
    Fields,
    Int,
    Number,
    Size,
    Spec,
    Str,
    Table,
    ValueTypeError,
    check_keys,
    got,
    keyname,
)


class ScenarioError(UmbpSimError):
    """A malformed scenario file. The message starts with the file and the key."""

    exit_code = EX_DATAERR


STEP_OPS = ("alloc", "free", "acquire", "release", "lookup", "mapped", "set_nr_hugepages")
LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head", "page_first_kv_split")

# Keys a [machine] table may hold besides `dump`: declared once, in umbp_sim/machine.py.
MACHINE_KEYS = set(SCENARIO_MACHINE_KEYS)
# Besides SGLANG_HICACHE_HOST_*: sglang's shared-buffer switch and mori's log levels.
ENV_KEYS = {"UMBP_STANDALONE_ADDRESS", *MORI_LOG_ENV}


@dataclass
class Scenario:
    path: Path
    name: str
    description: str
    source: str
    machine: dict[str, Any]  # raw [machine] table; `dump` resolved to an absolute Path
    faults: list[dict[str, Any]]  # raw [[faults]] tables, read by FaultPlan.from_dict
    env: dict[str, str]
    request_kind: str  # "alloc" | "steps" | "sglang"
    request: dict[str, Any]
    expect: dict[str, Any]
    tags: list[str] = field(default_factory=list)
    fault_seed: int = 0
    # The allocator profile the expectations are written for ([scenario].allocator); None: the
    # outcome is the same under every profile (tests/test_profiles.py checks that).
    allocator: str | None = None
    # Whose sglang UMBPHostTensorAllocator an sglang request runs ([scenario].sglang): a
    # release umbp-sim emulates or "installed"; None: the newest emulated release.
    sglang: str | None = None

    @property
    def label(self) -> str:
        return f"{self.path.name}: {self.name}"


def _err(path: Path, key: str, msg: str) -> ScenarioError:
    return ScenarioError(f"{path}: {key}: {msg}")


def _checked(path: Path, spec: Spec, value: Any, where: str) -> None:
    """``spec.check`` with the error as a ScenarioError naming the file and the key."""
    try:
        spec.check(value, where)
    except ValueTypeError as e:
        raise ScenarioError(f"{path}: {e}") from None


def _table(path: Path, doc: dict[str, Any], key: str, required: bool) -> dict[str, Any]:
    value = doc.get(key)
    if value is None:
        if required:
            raise _err(path, f"[{key}]", "missing table")
        return {}
    if not isinstance(value, dict):
        raise _err(path, f"[{key}]", f"expected a table, got {got(value)}")
    return value


def scenario_tree(path: Path, root: str | Path | None = None) -> Path:
    """The tree a scenario's ``dump =`` must stay in: ``root`` (the directory it was
    collected from: ``umbp-sim run DIR``, an ``umbp_sim_scenarios`` folder), else the bundled
    library when the file is one of its scenarios (``field/*.toml`` load ``../dumps/``), else
    the directory holding the file. Physical (symbolic links resolved)."""
    here = path.parent.resolve()
    if root is not None:
        tree = Path(root).resolve()
        if here.is_relative_to(tree):
            return tree
    from umbp_sim.scenario.bundled import bundled_scenarios_dir

    bundled = bundled_scenarios_dir().resolve()
    return bundled if here.is_relative_to(bundled) else here


def _dump_path(path: Path, raw: str, tree: Path) -> Path:
    """``[machine].dump``: a directory or a tarball, relative to the scenario file (or
    absolute), inside the scenario's ``tree`` (scenario_tree) and never through a symbolic
    link: none below the scenario's directory, and the dump itself not one. The runner opens it
    with ``open_dump(..., follow_symlinks=False, bare=False)``, so a scenario from elsewhere
    cannot point umbp-sim at another file (``dump = "/etc/shadow"``, ``dump = "/"``: this
    host's /proc) and have a line of it quoted in an error. A dump elsewhere is given on the
    command line (``umbp-sim replay DUMP``), where the user names it."""
    where = "[machine].dump"
    if not raw or "\0" in raw:
        raise _err(path, where, f"{shown(raw)} is not a path")
    if os.path.isabs(raw):
        current = Path(os.path.normpath(raw))
        parents = [current]
    else:
        current = path.parent.resolve()  # physical: ".." below is the real parent
        parents = []
        for part in raw.split("/"):
            if part not in ("", "."):
                current = current.parent if part == ".." else current / part
                parents.append(current)
    if not current.is_relative_to(tree):
        raise _err(
            path,
            where,
            f"{current} is outside the scenario tree {tree} (a dump elsewhere is given on the "
            "command line: umbp-sim replay DUMP)",
        )
    for step in parents:
        try:
            mode = os.lstat(step).st_mode
        except FileNotFoundError:
            raise _err(path, where, f"no such file: {step}") from None
        except OSError as e:
            raise _err(path, where, f"{shown(str(step))}: {e.strerror}") from None
        if stat.S_ISLNK(mode):
            raise _err(path, where, f"{step} is a symbolic link (not followed for dumps)")
    mode = os.lstat(current).st_mode
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        raise _err(path, where, f"{current} is not a dump directory or tarball")
    return current


# ---- what each key takes (umbp_sim.vocabulary.value_types) ---------------------------------------
# Bounds: what the simulator holds (sizes below 2^62 bytes, C ints), and a few thousand steps,
# rules or items, so no file can ask for unbounded work.
_C_INT = Int(-(1 << 31), MAX_INT)
_COUNT = Int(1, MAX_INT)


def _regex(value: Any, key: str) -> None:
    Str().check(value, key)
    why = pattern_problem(value)
    if why is not None:
        raise ValueTypeError(key, why)


ALLOC_TYPES: dict[str, Spec] = {
    "size": Size(),
    "backing": Str(choices=BACKINGS),
    "hugepage_size": Size(),
    "numa_node": _C_INT,
    "prefault": Bool(),
}
ALLOC_KEYS = set(ALLOC_TYPES)
SGLANG_TYPES: dict[str, Spec] = {
    "layers": _COUNT, "kv_heads": _COUNT, "head_dim": _COUNT, "kv_lora_rank": _COUNT,
    "qk_rope_head_dim": Int(0, MAX_INT), "index_head_dim": Int(0, MAX_INT),
    "dtype": Str(max_len=40), "hicache_size": Number(0, MAX_BYTES / 1e9),
    "hicache_ratio": Number(0, 1e6), "device_pool_tokens": Int(0, MAX_INT),
    "page_size": _COUNT, "layout": Str(choices=LAYOUTS), "tp_size": _COUNT,
}  # fmt: skip
_OP = Str(choices=STEP_OPS)
_STEP_TYPES: dict[str, Fields] = {
    "alloc": Fields({**ALLOC_TYPES, "op": _OP, "id": Str(max_len=200)}, frozenset({"size", "id"})),
    "set_nr_hugepages": Fields(
        {"op": _OP, "hugepage_size": Size(), "pages": Int(0, MAX_BYTES), "node": Int(0, 1023)},
        frozenset({"pages"}),
    ),
    **{
        op: Fields(
            {"op": _OP, "id": Str(max_len=200), "offset": Size(), "size": Size()}, frozenset({"id"})
        )  # fmt: skip
        for op in ("free", "acquire", "release", "lookup", "mapped")
    },
}
MAX_STEPS = 10_000


def _step(step: Any, key: str) -> None:
    if not isinstance(step, dict):
        raise ValueTypeError(key, f"expected a table, got {got(step)}")
    _OP.check(step.get("op"), f"{key}.op")
    _STEP_TYPES[step["op"]].check(step, key)


_REQUEST_TYPES: dict[str, Fields] = {
    "alloc": Fields(ALLOC_TYPES, frozenset({"size"})),
    "steps": Fields({"steps": Array(Custom(_step, "a table"), 1, MAX_STEPS)}, frozenset({"steps"})),
    "sglang": Fields(SGLANG_TYPES, frozenset({"layers"})),
}
EXPECT_TYPES: dict[str, Spec] = {
    "outcome": Str(choices=OUTCOMES),
    "actual_backing": Str(choices=BACKINGS),
    "mapped_size": Size(hi=(1 << 64) - 1),
    "error": Str(),
    "error_regex": Custom(_regex, "a regular expression"),
    "warnings": Array(Str(), max_len=MAX_STEPS),
    "no_warnings": Bool(),
    "signal": Str(max_len=40),
    "crash_node": _C_INT,
    "counters": Table(
        Int(-(1 << 63), (1 << 63) - 1),
        key=Str(max_len=200),
        max_len=1000,
        what_text="a table of counter = integer",
    ),  # fmt: skip
    "no_leaks": Bool(),
    "steps": Array(Str(), max_len=MAX_STEPS),
}
EXPECT_KEYS = set(EXPECT_TYPES)
SCENARIO_TYPES = Fields(
    {
        "name": Str(max_len=200),
        "description": Str(),
        "source": Str(),
        "tags": Array(Str(max_len=200), max_len=100),
        "allocator": Str(max_len=4096),
        "sglang": Str(choices=tuple(SGLANG_RELEASES)),
    },
    frozenset({"name", "description"}),
)
MACHINE_TYPES = Fields({**SCENARIO_MACHINE_TYPES, "dump": Str(nonempty=True)})
ENV_TYPES = Table(Str(max_len=4096), max_len=100)
MAX_FAULTS = 1000
_FAULTS = Array(Table(Custom(lambda value, key: None)), max_len=MAX_FAULTS)


def _load_request(path: Path, req: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    kind = req.get("kind", "alloc")
    _checked(path, Str(choices=("alloc", "steps", "sglang")), kind, "[request].kind")
    body = {k: v for k, v in req.items() if k != "kind"}
    if kind == "alloc" and "size" not in body and set(body) <= ALLOC_KEYS:
        raise _err(path, "[request].size", "missing (an alloc request needs a size)")
    _checked(path, _REQUEST_TYPES[kind], body, "[request]")
    if kind == "sglang" and ("hicache_size" in body) == ("hicache_ratio" in body):
        raise _err(path, "[request]", "give exactly one of hicache_size or hicache_ratio")
    return str(kind), body


def _load_expect(path: Path, exp: dict[str, Any]) -> dict[str, Any]:
    check_keys_in(path, "[expect]", exp, EXPECT_KEYS)
    if "outcome" not in exp:
        raise _err(path, "[expect].outcome", f"missing (one of {', '.join(OUTCOMES)})")
    _checked(path, Fields(EXPECT_TYPES), exp, "[expect]")
    return exp


def check_keys_in(path: Path, where: str, table: dict[str, Any], allowed: set[str]) -> None:
    try:
        check_keys(table, allowed, where)
    except ValueTypeError as e:
        raise ScenarioError(f"{path}: {e}") from None


# `umbp_sim_scenario = 1`, the file's first line: declares the file an umbp-sim scenario (the
# pytest plugin collects only such files, or files under its `umbp_sim_scenarios` folders).
MARKER_KEY = "umbp_sim_scenario"
TOP_KEYS = {MARKER_KEY, "scenario", "machine", "faults", "fault_seed", "env", "request", "expect"}


def load_scenario(path: str | Path, root: str | Path | None = None) -> Scenario:
    """Read and check one scenario file; ``root``: the directory it was collected from, which
    its ``dump =`` may reach (see scenario_tree)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ScenarioError(f"{p}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ScenarioError(f"{p}: not UTF-8 text") from None
    try:
        doc = read_toml(text)
    except TomlError as e:
        raise ScenarioError(f"{p}: invalid TOML: {e}") from None
    check_keys_in(p, "", doc, TOP_KEYS)
    marker = doc.get(MARKER_KEY, 1)
    if marker != 1 or isinstance(marker, bool):
        raise _err(p, MARKER_KEY, f"must be 1 (the scenario format version), not {shown(marker)}")
    fault_seed = doc.get("fault_seed", 0)
    _checked(p, Int(0, (1 << 64) - 1, "does not fit in 64 bits"), fault_seed, "fault_seed")

    meta = _table(p, doc, "scenario", required=True)
    _checked(p, SCENARIO_TYPES, meta, "[scenario]")
    name, description = meta["name"], meta["description"]
    source = meta.get("source", "")
    tags = meta.get("tags", [])
    allocator = meta.get("allocator")
    if allocator is not None:
        from umbp_sim.allocator_profiles import ProfileError, canonical_profile

        try:
            allocator = canonical_profile(allocator)
        except ProfileError as e:
            raise _err(p, "[scenario].allocator", str(e)) from None
    sglang = meta.get("sglang")

    machine = dict(_table(p, doc, "machine", required=True))
    _checked(p, MACHINE_TYPES, machine, "[machine]")
    if "dump" in machine:
        machine["dump"] = _dump_path(p, machine["dump"], scenario_tree(p, root))

    faults = doc.get("faults", [])
    _checked(p, _FAULTS, faults, "[[faults]]")  # the rules' values: FaultRule.from_dict
    if faults:
        from umbp_sim.faults import FaultPlan, FaultPlanError  # lazy: needs the native module

        try:
            FaultPlan.from_rules(faults, fault_seed)
        except (FaultPlanError, ValueError) as e:
            raise ScenarioError(f"{p}: {e}") from None

    env = _table(p, doc, "env", required=False)
    _checked(p, ENV_TYPES, env, "[env]")
    for key in env:
        if not key.startswith("SGLANG_HICACHE_HOST_") and key not in ENV_KEYS:
            raise _err(
                p,
                f"[env].{keyname(key)}",
                "only SGLANG_HICACHE_HOST_* and " + ", ".join(sorted(ENV_KEYS)) + " are read",
            )

    kind, request = _load_request(p, _table(p, doc, "request", required=True))
    expect = _load_expect(p, _table(p, doc, "expect", required=True))
    return Scenario(p, name, description, source, machine, faults, dict(env), kind, request,
                    expect, list(tags), fault_seed, allocator, sglang)  # fmt: skip


def find_scenarios(paths: list[str | Path]) -> list[Path]:
    """The .toml files under each path (a file is taken as is), sorted, without duplicates."""
    return [p for p, _root in find_scenarios_in(paths)]


def find_scenarios_in(paths: list[str | Path]) -> list[tuple[Path, Path | None]]:
    """find_scenarios' files, each with the directory argument it was found under (its
    scenario tree for load_scenario's ``root``), None for a file given itself."""
    found: list[tuple[Path, Path | None]] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found.extend((q, p) for q in sorted(q for q in p.rglob("*.toml") if q.is_file()))
        elif p.is_file():
            found.append((p, None))
        else:
            raise ScenarioError(f"{p}: no such file or directory")
    seen: set[Path] = set()
    unique = []
    for q, root in found:
        r = q.resolve()
        if r not in seen:
            seen.add(r)
            unique.append((q, root))
    return unique
