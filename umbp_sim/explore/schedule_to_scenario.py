"""Write a failing schedule (host, fault plan, steps, expectation) as a scenario TOML file.

The file has the format of scenarios/field/*.toml: ``umbp_sim.scenario.schema.load_scenario``
reads it and ``umbp_sim.scenario.scenario_run.run_scenario`` replays it. ``[expect]`` holds what the
reference model predicts (the correct behaviour), so the scenario fails while the bug is there
and passes once it is fixed; the description records what was observed instead.

Set ``UMBP_SIM_SAVE_FAILURES=DIR`` and every failing property of the exploration tests writes
its shrunk example to ``DIR/<test name>.toml`` (overwritten while Hypothesis shrinks, so the
last write is the minimal example), ready to be reviewed and moved to scenarios/regressions/.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import tomli_w

from umbp_sim.faults import FaultPlan
from umbp_sim.host.arch_sizes import default_hugepage_sizes, pmd_size
from umbp_sim.machine import MACHINE_FIELDS, SIZE_TABLE_FIELDS, Machine
from umbp_sim.vocabulary.units import size_key

ENV_VAR = "UMBP_SIM_SAVE_FAILURES"

# Every other Machine field (MACHINE_FIELDS) is written when it differs from a fresh Machine's;
# these are written as [machine] build keys instead.
_BUILT = {"arch", "page_size", "hugepage_sizes", "default_hugepage_size", "nodes", "name"}
_SIZE_TABLES = tuple(sorted(SIZE_TABLE_FIELDS))
_PLAIN_FIELDS = tuple(
    f.name for f in MACHINE_FIELDS if f.name not in _BUILT and f.name not in SIZE_TABLE_FIELDS
)


class UnwritableMachine(ValueError):
    """The machine cannot be written as a [machine] table (e.g. nodes of different sizes)."""


def save_dir() -> Path | None:
    """The directory UMBP_SIM_SAVE_FAILURES names, or None."""
    value = os.environ.get(ENV_VAR, "").strip()
    return Path(value) if value else None


def machine_table(machine: Machine) -> dict[str, Any]:
    """A ``[machine]`` table that ``runner.build_machine`` turns back into ``machine``."""
    mems = {n.mem_total for n in machine.nodes}
    ids = [n.id for n in machine.nodes]
    if len(mems) != 1 or ids != list(range(len(ids))):
        raise UnwritableMachine("nodes: only hosts with nodes 0..N-1 of one size can be written")
    for n in machine.nodes:
        if n.mem_free is not None or n.cpus or n.distances:
            raise UnwritableMachine(f"nodes[{n.id}]: mem_free/cpus/distances cannot be written")
        for pool in n.hugepages.values():
            if pool.surplus:
                raise UnwritableMachine(f"nodes[{n.id}]: surplus pages cannot be written")
    fresh = Machine()
    table: dict[str, Any] = {
        "arch": machine.arch,
        "nodes": len(machine.nodes),
        "mem_per_node": machine.nodes[0].mem_total,
        "page_size": machine.page_size,
    }
    if list(machine.hugepage_sizes) != default_hugepage_sizes(machine.arch, machine.page_size):
        table["hugepage_sizes"] = [size_key(s) for s in machine.hugepage_sizes]
    default = (
        pmd_size(machine.arch, machine.page_size, machine.hugepage_sizes)
        if machine.hugepage_sizes
        else None
    )
    if machine.default_hugepage_size != default and machine.default_hugepage_size is not None:
        table["default_hugepage_size"] = size_key(machine.default_hugepage_size)
    pools = [{size_key(s): p.total for s, p in n.hugepages.items()} for n in machine.nodes]
    if any(pools):
        table["hugepages_per_node"] = pools
    if any(p.free is not None for n in machine.nodes for p in n.hugepages.values()):
        table["free_hugepages_per_node"] = [
            {size_key(s): p.free_pages() for s, p in n.hugepages.items()} for n in machine.nodes
        ]
    for key in _SIZE_TABLES:
        value = getattr(machine, key)
        if value:
            table[key] = {size_key(s): v for s, v in value.items()}
    for key in _PLAIN_FIELDS:
        value = getattr(machine, key)
        if value != getattr(fresh, key) and value is not None:
            table[key] = value
    if machine.name != fresh.name:
        table["name"] = machine.name
    return table


def scenario_document(
    *,
    name: str,
    description: str,
    machine: Machine,
    steps: list[dict[str, Any]],
    expect: dict[str, Any],
    faults: FaultPlan | None = None,
    source: str = "umbp_sim.explore: a shrunk failing example",
    tags: list[str] | None = None,
) -> dict[str, Any]:
    """The scenario as a TOML-ready dict (``[request] kind = "steps"``)."""
    doc: dict[str, Any] = {
        "umbp_sim_scenario": 1,  # declares the file (the pytest plugin collects it)
        "scenario": {
            "name": name,
            "description": description,
            "source": source,
            "tags": list(tags or ["explore"]),
        },
        "machine": machine_table(machine),
    }
    if faults is not None and faults.rules:
        plan = faults.to_dict()
        if "fault_seed" in plan:
            doc["fault_seed"] = plan["fault_seed"]
        doc["faults"] = plan["faults"]
    doc["request"] = {"kind": "steps", "steps": [_clean(s) for s in steps]}
    doc["expect"] = _clean(expect)
    return doc


def _clean(table: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in table.items() if v is not None}


def write_scenario(path: str | os.PathLike[str], **kw: Any) -> Path:
    """Write ``scenario_document(**kw)`` to ``path`` (parents created) and return the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(tomli_w.dumps(scenario_document(**kw)), encoding="utf-8")
    return p


def slug(text: str) -> str:
    """A file-name-safe form of a test name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "failure"
