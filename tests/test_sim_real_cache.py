"""The SimKernel's reuse of small real ranges: invisible to the simulated process."""

from __future__ import annotations

import ctypes

from umbp_sim import _native
from umbp_sim.machine import Machine
from umbp_sim.sim import build_kernel

C = _native.constants
PRW = C["PROT_READ"] | C["PROT_WRITE"]
ANON = C["MAP_PRIVATE"] | C["MAP_ANONYMOUS"]


def test_reused_range_reads_as_fresh_zero_memory() -> None:
    k = build_kernel(Machine.x86_64())
    a = k.mmap(0, 8192, PRW, ANON).value
    ctypes.memset(a, 0xAB, 8192)
    assert k.munmap(a, 8192).ok
    b = k.mmap(0, 8192, PRW, ANON).value
    assert b == a  # the cached range came back...
    assert ctypes.string_at(b, 8192) == bytes(8192)  # ...zeroed, like a new anonymous mapping
    assert k.munmap(b, 8192).ok


def test_map_fixed_over_a_cached_range_succeeds() -> None:
    k = build_kernel(Machine.x86_64())
    a = k.mmap(0, 4096, PRW, ANON).value
    assert k.munmap(a, 4096).ok  # now cached, still really mapped
    r = k.mmap(a, 4096, PRW, ANON | C["MAP_FIXED"])
    assert r.ok and r.value == a
    assert [(m["start"], m["length"]) for m in k.mappings()] == [(a, 4096)]
    ctypes.memset(a, 1, 4096)  # really mapped and writable
    assert k.munmap(a, 4096).ok


def test_cached_ranges_are_not_simulated_mappings() -> None:
    k = build_kernel(Machine.x86_64())
    addrs = [k.mmap(0, 4096, PRW, ANON).value for _ in range(4)]
    for a in addrs:
        assert k.munmap(a, 4096).ok
    assert k.mappings() == []
    assert k.committed_as() == 0
