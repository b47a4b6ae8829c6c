"""Scenario files: one simulated host, its faults, one request, the outcome that must follow.

Loading checks every key against the schema below; an unknown key, a wrong type or a bad value
is a ``ScenarioError`` naming the file and the key (``scenarios/x.toml: [request].size: ...``).
Nothing here runs anything: ``umbp_sim.scenario.runner`` does.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from umbp_sim.backing import BACKINGS, OUTCOMES
from umbp_sim.errors import UmbpSimError
from umbp_sim.machine import SCENARIO_MACHINE_KEYS
from umbp_sim.profiles import MORI_LOG_ENV
from umbp_sim.units import SizeError, parse_size

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


class ScenarioError(UmbpSimError):
    """A malformed scenario file. The message starts with the file and the key."""

    exit_code = 65


STEP_OPS = ("alloc", "free", "acquire", "release", "lookup", "set_nr_hugepages")
LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head", "page_first_kv_split")

# Keys a [machine] table may hold besides `dump`: declared once, in umbp_sim/machine.py.
MACHINE_KEYS = set(SCENARIO_MACHINE_KEYS)
# Besides SGLANG_HICACHE_HOST_*: sglang's shared-buffer switch and mori's log levels.
ENV_KEYS = {"UMBP_STANDALONE_ADDRESS", *MORI_LOG_ENV}
ALLOC_KEYS = {"size", "backing", "hugepage_size", "numa_node", "prefault"}
SGLANG_KEYS = {
    "layers", "kv_heads", "head_dim", "kv_lora_rank", "qk_rope_head_dim", "dtype",
    "hicache_size", "hicache_ratio", "device_pool_tokens", "page_size", "layout",
    "index_head_dim", "tp_size",
}  # fmt: skip
EXPECT_KEYS = {
    "outcome", "actual_backing", "mapped_size", "error", "error_regex", "warnings",
    "no_warnings", "signal", "crash_node", "counters", "no_leaks", "steps",
}  # fmt: skip


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
    # outcome is the same under every profile (tests/test_scenario_profiles.py checks that).
    allocator: str | None = None
    # Whose sglang UMBPHostTensorAllocator an sglang request runs ([scenario].sglang): a
    # release umbp-sim emulates or "installed"; None: the newest emulated release.
    sglang: str | None = None

    @property
    def label(self) -> str:
        return f"{self.path.name}: {self.name}"


def _err(path: Path, key: str, msg: str) -> ScenarioError:
    return ScenarioError(f"{path}: {key}: {msg}")


def _check_keys(path: Path, where: str, table: dict[str, Any], allowed: set[str]) -> None:
    for key in table:
        if key not in allowed:
            hint = ", ".join(sorted(allowed))
            raise _err(path, f"{where}.{key}" if where else key, f"unknown key (allowed: {hint})")


def _table(path: Path, doc: dict[str, Any], key: str, required: bool) -> dict[str, Any]:
    value = doc.get(key)
    if value is None:
        if required:
            raise _err(path, f"[{key}]", "missing table")
        return {}
    if not isinstance(value, dict):
        raise _err(path, f"[{key}]", f"must be a table, not {type(value).__name__}")
    return value


def _string(path: Path, where: str, value: Any) -> str:
    if not isinstance(value, str):
        raise _err(path, where, f"must be a string, not {value!r}")
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
        raise _err(path, where, f"{raw!r} is not a path")
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
            raise _err(path, where, f"{step}: {e.strerror}") from None
        if stat.S_ISLNK(mode):
            raise _err(path, where, f"{step} is a symbolic link (not followed for dumps)")
    mode = os.lstat(current).st_mode
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        raise _err(path, where, f"{current} is not a dump directory or tarball")
    return current


def _size(path: Path, where: str, value: Any) -> int:
    try:
        return parse_size(value, where)
    except SizeError as e:
        raise ScenarioError(f"{path}: {e}") from None


def _choice(path: Path, where: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise _err(path, where, f"{value!r} is not one of {', '.join(choices)}")
    return str(value)


def _check_alloc(path: Path, where: str, table: dict[str, Any], allowed: set[str]) -> None:
    _check_keys(path, where, table, allowed)
    if "size" in table:
        _size(path, f"{where}.size", table["size"])
    if "backing" in table:
        _choice(path, f"{where}.backing", table["backing"], BACKINGS)
    if "hugepage_size" in table:
        _size(path, f"{where}.hugepage_size", table["hugepage_size"])
    if "numa_node" in table and (
        not isinstance(table["numa_node"], int) or isinstance(table["numa_node"], bool)
    ):
        raise _err(path, f"{where}.numa_node", f"must be an integer, not {table['numa_node']!r}")
    if "prefault" in table and not isinstance(table["prefault"], bool):
        raise _err(path, f"{where}.prefault", "must be true or false")


def _load_request(path: Path, req: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    kind = req.get("kind", "alloc")
    _choice(path, "[request].kind", kind, ("alloc", "steps", "sglang"))
    body = {k: v for k, v in req.items() if k != "kind"}
    if kind == "alloc":
        _check_alloc(path, "[request]", body, ALLOC_KEYS)
        if "size" not in body:
            raise _err(path, "[request].size", "missing (an alloc request needs a size)")
    elif kind == "steps":
        _check_keys(path, "[request]", body, {"steps"})
        steps = body.get("steps")
        if not isinstance(steps, list) or not steps:
            raise _err(path, "[request].steps", "must be a non-empty array of tables")
        for i, step in enumerate(steps):
            where = f"[request].steps[{i}]"
            if not isinstance(step, dict):
                raise _err(path, where, "must be a table")
            op = _choice(path, f"{where}.op", step.get("op"), STEP_OPS)
            if op == "alloc":
                _check_alloc(path, where, step, ALLOC_KEYS | {"op", "id"})
                if "size" not in step:
                    raise _err(path, f"{where}.size", "missing")
            elif op == "set_nr_hugepages":
                _check_keys(path, where, step, {"op", "hugepage_size", "pages", "node"})
                if not isinstance(step.get("pages"), int):
                    raise _err(path, f"{where}.pages", "must be an integer")
            else:
                _check_keys(path, where, step, {"op", "id", "offset", "size"})
                for key in ("offset", "size"):
                    if key in step:
                        _size(path, f"{where}.{key}", step[key])
            if op in ("alloc", "free", "acquire", "release", "lookup"):
                _string(path, f"{where}.id", step.get("id"))
    else:
        _check_keys(path, "[request]", body, SGLANG_KEYS)
        if "layers" not in body:
            raise _err(path, "[request].layers", "missing")
        if "layout" in body:
            _choice(path, "[request].layout", body["layout"], LAYOUTS)
        if ("hicache_size" in body) == ("hicache_ratio" in body):
            raise _err(path, "[request]", "give exactly one of hicache_size or hicache_ratio")
    return str(kind), body


def _load_expect(path: Path, exp: dict[str, Any]) -> dict[str, Any]:
    _check_keys(path, "[expect]", exp, EXPECT_KEYS)
    if "outcome" not in exp:
        raise _err(path, "[expect].outcome", f"missing (one of {', '.join(OUTCOMES)})")
    _choice(path, "[expect].outcome", exp["outcome"], OUTCOMES)
    if "actual_backing" in exp:
        _choice(path, "[expect].actual_backing", exp["actual_backing"], BACKINGS)
    if "error_regex" in exp:
        try:
            re.compile(_string(path, "[expect].error_regex", exp["error_regex"]))
        except re.error as e:
            raise _err(path, "[expect].error_regex", f"not a valid regex: {e}") from None
    if "warnings" in exp:
        w = exp["warnings"]
        if not isinstance(w, list) or not all(isinstance(s, str) for s in w):
            raise _err(path, "[expect].warnings", "must be an array of strings")
    if "counters" in exp:
        counters = exp["counters"]
        if not isinstance(counters, dict):
            raise _err(path, "[expect].counters", "must be a table of counter = integer")
        for key, value in counters.items():
            if not isinstance(value, int) or isinstance(value, bool):
                raise _err(path, f"[expect].counters.{key}", f"must be an integer, not {value!r}")
    return exp


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
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"{p}: invalid TOML: {e}") from None
    _check_keys(p, "", doc, TOP_KEYS)
    marker = doc.get(MARKER_KEY, 1)
    if marker != 1 or isinstance(marker, bool):
        raise _err(p, MARKER_KEY, f"must be 1 (the scenario format version), not {marker!r}")
    fault_seed = doc.get("fault_seed", 0)
    if not isinstance(fault_seed, int) or isinstance(fault_seed, bool) or fault_seed < 0:
        raise _err(p, "fault_seed", f"must be a non-negative integer, not {fault_seed!r}")

    meta = _table(p, doc, "scenario", required=True)
    _check_keys(
        p, "[scenario]", meta, {"name", "description", "source", "tags", "allocator", "sglang"}
    )
    name = _string(p, "[scenario].name", meta.get("name"))
    description = _string(p, "[scenario].description", meta.get("description"))
    source = _string(p, "[scenario].source", meta.get("source", ""))
    tags = meta.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise _err(p, "[scenario].tags", "must be an array of strings")
    allocator = meta.get("allocator")
    if allocator is not None:
        from umbp_sim.profiles import ProfileError, canonical_profile

        try:
            allocator = canonical_profile(_string(p, "[scenario].allocator", allocator))
        except ProfileError as e:
            raise _err(p, "[scenario].allocator", str(e)) from None
    sglang = meta.get("sglang")
    if sglang is not None:
        from umbp_sim.sglang.release import SGLANG_RELEASES

        if sglang not in SGLANG_RELEASES:
            raise _err(p, "[scenario].sglang", f"must be one of {', '.join(SGLANG_RELEASES)}")

    machine = dict(_table(p, doc, "machine", required=True))
    _check_keys(p, "[machine]", machine, MACHINE_KEYS | {"dump"})
    if "dump" in machine:
        raw = _string(p, "[machine].dump", machine["dump"])
        machine["dump"] = _dump_path(p, raw, scenario_tree(p, root))

    faults = doc.get("faults", [])
    if not isinstance(faults, list) or not all(isinstance(f, dict) for f in faults):
        raise _err(p, "[[faults]]", "must be an array of tables")
    if faults:
        from umbp_sim.faults import FaultPlan, FaultPlanError  # lazy: needs the native module

        try:
            FaultPlan.from_rules(faults, fault_seed)
        except (FaultPlanError, ValueError) as e:
            raise ScenarioError(f"{p}: {e}") from None

    env = _table(p, doc, "env", required=False)
    for key, value in env.items():
        if not key.startswith("SGLANG_HICACHE_HOST_") and key not in ENV_KEYS:
            raise _err(
                p,
                f"[env].{key}",
                "only SGLANG_HICACHE_HOST_* and " + ", ".join(sorted(ENV_KEYS)) + " are read",
            )
        _string(p, f"[env].{key}", value)

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
