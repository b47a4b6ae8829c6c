"""How a fix's host change lasts past a reboot: beside its live commands (``sysctl -w``, a write
to a hugepage pool file), what the host reads at boot.

- ``sysctl -w vm.KEY=VALUE``: a line ``vm.KEY = VALUE`` in a file of ``/etc/sysctl.d/``;
- a pool of a size other than the default (``/sys/kernel/mm/hugepages/hugepages-NkB/``): the
  kernel command line ``hugepagesz=SIZE hugepages=N`` (also the reliable way to get gigantic
  pages, which a running host may be too fragmented to give);
- one node's pool: ``hugepagesz=SIZE hugepages=NODE:N`` on the command line from 5.16 on
  (commit b5389086ad7b); before, a unit that writes the node's file at boot;
- what the command line cannot set (a non-default size's ``nr_overcommit_hugepages``, a cgroup
  limit): the service's own configuration, or a unit that runs the command at boot.

A change of the request (``--numa-node``, ``--size``, an environment variable) is the
server's configuration: nothing to persist here.

>>> from umbp_sim.machine import Machine
>>> persistent(["sysctl -w vm.nr_hugepages=1024"], Machine.x86_64())
['/etc/sysctl.d/90-hugepages.conf: vm.nr_hugepages = 1024']
"""

from __future__ import annotations

import re

from umbp_sim.machine import Machine

_SYSCTL = re.compile(r"^sysctl -w (vm\.[a-z_]+)=(\S+)$")
_POOL = re.compile(r"^echo (\d+) > /sys/kernel/mm/hugepages/hugepages-(\d+)kB/nr_hugepages$")
_NODE_POOL = re.compile(
    r"^echo (\d+) > /sys/devices/system/node/node(\d+)/hugepages/hugepages-(\d+)kB/nr_hugepages$"
)
_CGROUP = re.compile(r"^echo \S+ > /sys/fs/cgroup/")
_AT_BOOT = re.compile(r"^echo \S+ > /sys/")
NODE_FORMAT_SINCE = (5, 16)  # hugepages=NODE:COUNT on the kernel command line


def boot_size(size: int) -> str:
    """A hugepage size as ``hugepagesz=`` takes it: 2M, 1G, 64K."""
    for unit, shift in (("G", 30), ("M", 20)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift}{unit}"
    return f"{size >> 10}K"


def persistent(commands: list[str], machine: Machine) -> list[str]:
    """What makes ``commands`` (a fix's live commands on ``machine``) last past a reboot, one
    line per place; empty when they change nothing of the host."""
    sysctls: list[str] = []
    cmdline: list[str] = []
    units: list[str] = []
    cgroups: list[str] = []
    for command in commands:
        if m := _SYSCTL.match(command):
            sysctls.append(f"{m[1]} = {m[2]}")
        elif m := _POOL.match(command):
            cmdline.append(f"hugepagesz={boot_size(int(m[2]) << 10)} hugepages={m[1]}")
        elif m := _NODE_POOL.match(command):
            if machine.kernel_tuple()[:2] >= NODE_FORMAT_SINCE:
                size = boot_size(int(m[3]) << 10)
                cmdline.append(f"hugepagesz={size} hugepages={m[2]}:{m[1]}")
            else:
                units.append(command)
        elif _CGROUP.match(command):
            cgroups.append(command)
        elif _AT_BOOT.match(command):
            units.append(command)
    out = []
    if sysctls:
        out.append("/etc/sysctl.d/90-hugepages.conf: " + "; ".join(sysctls))
    if cmdline:
        out.append("kernel command line: " + " ".join(cmdline))
    for command in units:
        out.append(f"a unit run at boot: {command}")
    for command in cgroups:
        out.append(f"the limits the server's service or container starts it with: {command}")
    return out


__all__ = ["boot_size", "persistent"]
