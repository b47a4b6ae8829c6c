"""How a fix's host change lasts past a reboot: beside its live commands (``sysctl -w``, a write
to a hugepage pool file), what the host reads at boot. Read from the fix's data (its
``PoolWrite`` admin writes, its ``sysctls`` and ``service`` limits), never from its commands.

- a sysctl, and a pool of the default size (``vm.nr_hugepages``, ``vm.nr_overcommit_hugepages``):
  a line ``vm.KEY = VALUE`` in a file of ``/etc/sysctl.d/``;
- a pool of a size other than the default: the kernel command line ``hugepagesz=SIZE
  hugepages=N`` (also the reliable way to get gigantic pages, which a running host may be too
  fragmented to give);
- one node's pool: ``hugepagesz=SIZE hugepages=NODE:N`` on the command line from 5.16 on
  (commit b5389086ad7b); before, a unit that writes the node's file at boot;
- what the command line cannot set (a non-default size's ``nr_overcommit_hugepages``): a unit
  that runs the write at boot; a cgroup limit or RLIMIT_AS: the service's own configuration.

A change of the request (``--numa-node``, ``--size``, an environment variable) is the
server's configuration: nothing to persist here.
"""

from __future__ import annotations

from umbp_sim.diagnose.fix import Fix
from umbp_sim.diagnose.pool_writes import PoolWrite, overcommit_command, pool_command
from umbp_sim.machine import Machine

NODE_FORMAT_SINCE = (5, 16)  # hugepages=NODE:COUNT on the kernel command line


def boot_size(size: int) -> str:
    """A hugepage size as ``hugepagesz=`` takes it: 2M, 1G, 64K."""
    for unit, shift in (("G", 30), ("M", 20)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift}{unit}"
    return f"{size >> 10}K"


def persistent(fix: Fix, machine: Machine) -> list[str]:
    """What makes ``fix`` (on ``machine``) last past a reboot, one line per place; empty when
    it changes nothing of the host.

    >>> from umbp_sim.diagnose.pool_writes import pool_write
    >>> persistent(Fix("grow", [], "pool", host_changes=[pool_write(2 << 20, 1024)]),
    ...            Machine.x86_64())
    ['/etc/sysctl.d/90-hugepages.conf: vm.nr_hugepages = 1024']
    """
    sysctls: list[str] = []
    cmdline: list[str] = []
    units: list[str] = []
    service: list[str] = []
    for single in fix.singles:
        sysctls += [f"{key} = {value}" for key, value in single.sysctls.items()]
        service += single.service
        for w in single.host_changes:
            if not isinstance(w, PoolWrite):
                continue
            default = w.size == machine.default_hugepage_size and w.node is None
            if default:
                sysctls.append(f"vm.{w.setting} = {w.count}")
            elif w.setting == "nr_overcommit_hugepages":
                units.append(overcommit_command(machine, w.size, w.count))
            elif w.node is None:
                cmdline.append(f"hugepagesz={boot_size(w.size)} hugepages={w.count}")
            elif machine.kernel_tuple()[:2] >= NODE_FORMAT_SINCE:
                cmdline.append(f"hugepagesz={boot_size(w.size)} hugepages={w.node}:{w.count}")
            else:
                units.append(pool_command(machine, w.size, w.count, w.node))
    out = []
    if sysctls:
        out.append("/etc/sysctl.d/90-hugepages.conf: " + "; ".join(sysctls))
    if cmdline:
        out.append("kernel command line: " + " ".join(cmdline))
    out += [f"a unit run at boot: {command}" for command in units]
    out += [f"the limits the server's service or container starts it with: {s}" for s in service]
    return out


__all__ = ["boot_size", "persistent"]
