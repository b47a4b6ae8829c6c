"""Machine dumps: a host's /proc and /sys, read into ``DumpFacts`` and a ``Machine``.

    facts = parse_dump("host.tar.gz")      # what the files say (None = not in the dump)
    machine = build_machine(facts)         # a validated Machine (guesses listed in facts.notes)
    machine = load_machine("host/")        # the same in one call

A dump is a directory or .tar/.tar.gz/.tar.bz2/.tar.xz in the hwloc-gather-topology layout
(``NAME/proc/meminfo``, ``NAME/sys/...``; the ``NAME/`` level is optional), or text as pasted
into a ticket (a meminfo, whole or grep'd, ``numactl -H``, sysfs values...: ``dump.paste``,
docs/pastes.md). Every error is a ``DumpError`` (exit code 65) naming the file inside the dump
(or the paste) and the line.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from umbp_sim.vocabulary import _lazy

# What the package offers, by the module that holds it: imported on first use (PEP 562), so
# importing one submodule (a parser's flags, a constant) does not load every other one. The
# imports below are the one list (umbp_sim/vocabulary/_lazy.py reads them for __getattr__; mypy
# types them).
if TYPE_CHECKING:
    from umbp_sim.dump.directory import (
        DirSource as DirSource,
    )
    from umbp_sim.dump.dump_error import (
        DumpError as DumpError,
    )
    from umbp_sim.dump.facts import (
        DEFAULT_KERNEL_VERSION as DEFAULT_KERNEL_VERSION,
        DumpFacts as DumpFacts,
        GlobalPool as GlobalPool,
        NodeFacts as NodeFacts,
        NodePool as NodePool,
        infer_arch as infer_arch,
        parse_dump as parse_dump,
        spread as spread,
    )
    from umbp_sim.dump.opener import (
        bytes_source as bytes_source,
        open_dump as open_dump,
    )
    from umbp_sim.dump.parse import (
        cgroup_hugetlb_size as cgroup_hugetlb_size,
        hugepage_dir_size as hugepage_dir_size,
        parse_cgroup_max as parse_cgroup_max,
        parse_cpulist as parse_cpulist,
        parse_distance as parse_distance,
        parse_int as parse_int,
        parse_limits as parse_limits,
        parse_meminfo as parse_meminfo,
        parse_node_meminfo as parse_node_meminfo,
        parse_nodelist as parse_nodelist,
        parse_osrelease as parse_osrelease,
        parse_proc_version as parse_proc_version,
    )
    from umbp_sim.dump.source import (
        DumpSource as DumpSource,
        MemorySource as MemorySource,
    )
    from umbp_sim.dump.to_machine import (
        build_machine as build_machine,
    )


def __getattr__(name: str) -> Any:
    return _lazy.attribute(__name__, name, "load_dump", "load_machine")


def load_dump(path: str | os.PathLike[str] | DumpSource | bytes):  # -> (Machine, DumpFacts)
    """Read a dump once and return ``(machine, facts)``; ``facts.notes`` lists every guess."""
    from umbp_sim.dump.facts import parse_dump
    from umbp_sim.dump.to_machine import build_machine

    facts = parse_dump(path)
    return build_machine(facts), facts


def load_machine(path: str | os.PathLike[str] | DumpSource | bytes):  # -> Machine
    """A host from a dump (directory, .tar[.gz|.bz2|.xz] or a paste) in one call.

    Raises ``DumpError`` naming the file and line for a malformed dump."""
    return load_dump(path)[0]
