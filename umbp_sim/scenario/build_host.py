"""The simulated host of a scenario: its ``[machine]`` table as a ``Machine``.
``umbp_sim.scenario.scenario_run`` re-exports ``build_machine``."""

from __future__ import annotations

from typing import Any

from umbp_sim.machine import NODE_AND_POOL_KEYWORDS, HugePool, Machine
from umbp_sim.scenario.schema import Scenario, ScenarioError
from umbp_sim.vocabulary.units import parse_size


def build_machine(scn: Scenario) -> Machine:
    """The Machine of a scenario's [machine] table: a dump plus overrides, or built inline."""
    table = dict(scn.machine)
    try:
        free_per_node = table.pop("free_hugepages_per_node", None)
        if "dump" in table:
            dump = table.pop("dump")
            for key in NODE_AND_POOL_KEYWORDS:
                if key in table:
                    raise ScenarioError(
                        f"{scn.path}: [machine].{key}: cannot be combined with dump (the dump "
                        "gives the nodes and pools; override Machine fields instead)"
                    )
            from umbp_sim.dump import load_dump, open_dump

            # no symbolic link as the dump, no bare meminfo: see schema._dump_path
            src = open_dump(dump, follow_symlinks=False, bare=False)
            try:
                machine = load_dump(src)[0].apply(**table)
            finally:
                src.close()
        else:
            machine = Machine.build(**table)  # type: ignore[arg-type]
        if free_per_node is not None:
            _set_free_pages(scn, machine, free_per_node)
        return machine.validate()
    except ScenarioError:
        raise
    except (ValueError, TypeError) as e:
        raise ScenarioError(f"{scn.path}: [machine]: {e}") from None


def _set_free_pages(scn: Scenario, machine: Machine, per_node: Any) -> None:
    if not isinstance(per_node, list) or len(per_node) != len(machine.nodes):
        raise ScenarioError(
            f"{scn.path}: [machine].free_hugepages_per_node: needs one table per node "
            f"({len(machine.nodes)})"
        )
    for node, table in zip(machine.nodes, per_node, strict=True):
        for size, free in table.items():
            s = parse_size(size, "free_hugepages_per_node")
            pool = node.hugepages.setdefault(s, HugePool())
            pool.free = free
