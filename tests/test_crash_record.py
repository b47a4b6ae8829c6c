"""SimKernel's crash record is declared once (UMBP_SIM_CRASH_FIELDS in csrc/kernel/sim_kernel.h,
``_native.CRASH_FIELDS``): SimKernel's ``crash_info()``, ``SimulatedCrash``'s arguments, the
post-mortem an external build's interposer writes and its reader's ``KernelCrash`` all carry
those fields by those names (the post-mortem's reader refuses any other: test_evidence_channel;
a death read through it: tests/external/test_crash_evidence.py)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from umbp_sim import Machine, _native
from umbp_sim.allocator import UMBPHostBufferBacking, UMBPHostMemAllocator
from umbp_sim.comparison.matrix import machine
from umbp_sim.errors import SimulatedCrash
from umbp_sim.external.evidence import KernelCrash
from umbp_sim.sim import SimHost

FIELDS = _native.CRASH_FIELDS


def _per_node_host() -> Machine:
    # 2 MiB pages on node 0 only: a hugetlb buffer bound to node 1, touched, dies of SIGBUS.
    return machine("pool-on-node0")


def test_the_declared_fields_are_what_each_python_record_carries() -> None:
    assert len(FIELDS) == len(set(FIELDS)) >= 5 and FIELDS[0] == "signal"
    assert tuple(inspect.signature(SimulatedCrash.__init__).parameters)[1:] == FIELDS
    assert tuple(f.name for f in dataclasses.fields(KernelCrash)) == (*FIELDS, "text")


def test_a_simkernel_death_reads_as_the_declared_fields() -> None:
    host = SimHost(_per_node_host())
    allocator = UMBPHostMemAllocator(kernel=host.kernel, profile="mori")
    with pytest.raises(SimulatedCrash) as e:
        allocator.alloc(4 << 20, UMBPHostBufferBacking.AnonymousHugetlb, 2 << 20, 1, True)
    info = host.kernel.crash_info()
    assert tuple(info) == FIELDS
    assert (info["signal"], info["node"], info["hugepage_size"]) == ("SIGBUS", 1, 2 << 20)
    assert {f: getattr(e.value, f) for f in FIELDS} == info
    assert host.crash is not None and str(host.crash) == str(e.value)
