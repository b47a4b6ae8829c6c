"""Machine dumps: a host's /proc and /sys, read into ``DumpFacts`` and a ``Machine``.

    facts = parse_dump("host.tar.gz")      # what the files say (None = not in the dump)
    machine = facts.to_machine()           # a validated Machine (guesses listed in facts.notes)
    machine = Machine.from_dump("host/")   # the same in one call

A dump is a directory or .tar/.tar.gz/.tar.bz2/.tar.xz in the hwloc-gather-topology layout
(``NAME/proc/meminfo``, ``NAME/sys/...``; the ``NAME/`` level is optional), or a bare meminfo
file. Every error is a ``DumpError`` (exit code 65) naming the file inside the dump and the line.
"""

from __future__ import annotations

import os

from umbp_sim.dump.build import build_machine
from umbp_sim.dump.errors import DumpError
from umbp_sim.dump.facts import (
    DEFAULT_KERNEL_VERSION,
    DumpFacts,
    GlobalPool,
    NodeFacts,
    NodePool,
    infer_arch,
    parse_dump,
    spread,
)
from umbp_sim.dump.parse import (
    cgroup_hugetlb_name,
    cgroup_hugetlb_size,
    hugepage_dir_size,
    parse_cgroup_max,
    parse_cpulist,
    parse_distance,
    parse_int,
    parse_limits,
    parse_meminfo,
    parse_node_meminfo,
    parse_nodelist,
    parse_osrelease,
    parse_proc_version,
)
from umbp_sim.dump.source import DirSource, DumpSource, MemorySource, bytes_source, open_dump


def load_dump(path: str | os.PathLike[str] | DumpSource | bytes):  # -> (Machine, DumpFacts)
    """Read a dump once and return ``(machine, facts)``; ``facts.notes`` lists every guess."""
    facts = parse_dump(path)
    return build_machine(facts), facts


__all__ = [
    "DEFAULT_KERNEL_VERSION",
    "DirSource",
    "DumpError",
    "DumpFacts",
    "DumpSource",
    "GlobalPool",
    "MemorySource",
    "NodeFacts",
    "NodePool",
    "build_machine",
    "bytes_source",
    "cgroup_hugetlb_name",
    "cgroup_hugetlb_size",
    "hugepage_dir_size",
    "infer_arch",
    "load_dump",
    "open_dump",
    "parse_cgroup_max",
    "parse_cpulist",
    "parse_distance",
    "parse_dump",
    "parse_int",
    "parse_limits",
    "parse_meminfo",
    "parse_node_meminfo",
    "parse_nodelist",
    "parse_osrelease",
    "parse_proc_version",
    "spread",
]
