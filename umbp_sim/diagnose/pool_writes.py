"""Admin writes of a hugepage pool setting, as a fix applies them to a simulated host, and the
commands a person would type for them."""

from __future__ import annotations

from dataclasses import dataclass

from umbp_sim.diagnose.fix import HostChange
from umbp_sim.machine import Machine
from umbp_sim.sim import SimHost


@dataclass(frozen=True)
class PoolWrite:
    """An admin write of a hugepage pool setting (a :data:`HostChange`): ``nr_hugepages`` or
    ``nr_overcommit_hugepages`` of one page size, host-wide or (``node``) one node's."""

    setting: str  # "nr_hugepages" | "nr_overcommit_hugepages"
    size: int
    count: int
    node: int | None = None

    @property
    def target(self) -> tuple[str, int, int | None]:
        """The file written: two writes with one target leave only the last one's value."""
        return (self.setting, self.size, self.node)

    def __call__(self, host: SimHost) -> str | None:
        if self.setting == "nr_overcommit_hugepages":
            try:
                host.set_nr_overcommit_hugepages(self.size, self.count)
            except OSError as e:
                return f"the kernel refused nr_overcommit_hugepages={self.count}: {e.strerror}"
            return None
        node, size, count = self.node, self.size, self.count
        before = host.node_hugepages(node, size) if node is not None else host.hugepages(size)
        try:
            host.set_nr_hugepages(size, count, node)
        except OSError as e:
            return f"the kernel refused nr_hugepages={count}: {e.strerror}"
        after = host.node_hugepages(node, size) if node is not None else host.hugepages(size)
        if after.total < count and after.total >= before.total:
            where = f"node {node}" if node is not None else "the host"
            return f"the kernel made only {after.total} of {count} pages on {where}"
        return None


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
