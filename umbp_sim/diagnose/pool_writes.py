"""Admin writes of a hugepage pool setting, as a fix asks for them (``PoolWrite``: data the
engine applies, ``umbp_sim.engine.host_changes``), and the commands a person would type for
them."""

from __future__ import annotations

from umbp_sim.engine.host_changes import HostChange, PoolWrite as PoolWrite
from umbp_sim.machine import Machine


def pool_write(size: int, count: int, node: int | None = None) -> HostChange:
    return PoolWrite("nr_hugepages", size, count, node)


def overcommit_write(size: int, count: int) -> HostChange:
    return PoolWrite("nr_overcommit_hugepages", size, count)


def pool_command(machine: Machine, size: int, count: int, node: int | None = None) -> str:
    if node is not None:
        return (
            f"echo {count} > /sys/devices/system/node/node{node}/hugepages/"
            f"hugepages-{size // 1024}kB/nr_hugepages"
        )
    if size == machine.default_hugepage_size:
        return f"sysctl -w vm.nr_hugepages={count}"
    return f"echo {count} > /sys/kernel/mm/hugepages/hugepages-{size // 1024}kB/nr_hugepages"


def overcommit_command(machine: Machine, size: int, count: int) -> str:
    if size == machine.default_hugepage_size:
        return f"sysctl -w vm.nr_overcommit_hugepages={count}"
    return (
        f"echo {count} > /sys/kernel/mm/hugepages/hugepages-{size // 1024}kB/"
        "nr_overcommit_hugepages"
    )


__all__ = ["PoolWrite", "overcommit_command", "overcommit_write", "pool_command", "pool_write"]
