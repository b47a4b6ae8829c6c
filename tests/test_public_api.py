"""The public Python names hold: a script written against one keeps working. A name that moves
keeps a deprecated alias that warns and still works (``Machine.from_dump``)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import umbp_sim
from umbp_sim import Machine
from umbp_sim.sim import SimHost

# What a user's script may name, by module (the top level) and by class: names may be added,
# never removed without an alias below.
PUBLIC = {
    "umbp_sim": [
        "Anonymous", "AnonymousHugetlb", "AnonymousShm", "AnonymousShmHugetlb", "FaultPlan",
        "HostGoneError", "HugePages", "HugePool", "Machine", "Mapping", "Node", "SimHost",
        "SimulatedCrash", "UMBPHostBufferBacking", "UMBPHostBufferHandle",
        "UMBPHostMemAllocator", "UMBPShmAllocation", "UmbpSimError", "get_include",
        "interposer_path", "simulate", "mori_compat",
    ],
    "umbp_sim.dump": ["DumpError", "DumpFacts", "load_dump", "load_machine", "parse_dump"],
    "umbp_sim.strategies": ["alloc_requests", "fault_plans", "machines", "AllocRequest"],
}  # fmt: skip
MEMBERS = {
    "Machine": [
        "apply", "arm64", "build", "copy", "from_dump", "kernel_tuple", "node_ids", "online",
        "possible", "ppc64le", "validate", "x86_64",
    ],
    "SimHost": [
        "crash", "files", "hugepages", "mapping_at", "mappings", "meminfo", "node_hugepages",
        "numbers", "open_fds", "read", "reasons", "reclaimable", "render", "set_nr_hugepages",
        "set_nr_overcommit_hugepages", "state",
    ],
    "FaultPlan": ["from_dict", "from_rules", "from_toml", "to_dict", "to_toml"],
    "UMBPHostMemAllocator": [
        "acquire_shm_allocation", "alloc", "free", "lookup_shm_allocation",
        "release_shm_allocation",
    ],
}  # fmt: skip


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_every_public_name_of_a_module_is_still_there(module: str) -> None:
    found = importlib.import_module(module)
    missing = [n for n in PUBLIC[module] if not hasattr(found, n)]
    assert missing == []


@pytest.mark.parametrize("cls", sorted(MEMBERS))
def test_every_public_member_of_a_class_is_still_there(cls: str) -> None:
    found = getattr(umbp_sim, cls)
    missing = [n for n in MEMBERS[cls] if not hasattr(found, n)]
    assert missing == []


def test_machine_from_dump_is_a_deprecated_alias_of_load_machine(tmp_path: Path) -> None:
    from umbp_sim.dump import load_machine

    SimHost(Machine.x86_64(nodes=2, mem_per_node="8GiB")).render(tmp_path / "dump")
    with pytest.warns(DeprecationWarning, match=r"^Machine.from_dump is deprecated: use "
                      r"umbp_sim.dump.load_machine\(path\)$"):  # fmt: skip
        old = Machine.from_dump(tmp_path / "dump")
    assert old == load_machine(tmp_path / "dump")
    assert [n.id for n in old.nodes] == [0, 1]


def test_diagnose_run_is_a_deprecated_alias_of_simulation() -> None:
    # One meaning per name: a Run is the engine's (umbp_sim.engine.spec.Run); what a replay's
    # simulation returned under that name is a Simulation.
    import umbp_sim.diagnose as diagnose
    from umbp_sim.diagnose.simulate import Simulation

    with pytest.warns(DeprecationWarning, match=r"^umbp_sim.diagnose.Run is deprecated: use "
                      r"umbp_sim.diagnose.Simulation$"):  # fmt: skip
        old = diagnose.Run
    assert old is Simulation is diagnose.Simulation
