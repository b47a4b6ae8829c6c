"""numa_node on the real (one-node) host: node 0 binds (numa_maps says so), nodes outside
/sys/devices/system/node/possible are not bound and warn, without a huge mask."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from conftest import mapping_of

from umbp_sim import (
    Anonymous,
    AnonymousHugetlb,
    AnonymousShm,
    UMBPHostMemAllocator,
)

PAGE = os.sysconf("SC_PAGESIZE")
MiB = 1 << 20
LOGGER = "umbp_sim.allocator"
POSSIBLE = Path("/sys/devices/system/node/possible").read_text().strip()


def policy_of(addr: int) -> str:
    """The policy column of /proc/self/numa_maps for the VMA containing addr (neighbouring
    mappings with the same policy merge into one VMA)."""
    line = mapping_of(addr)
    assert line is not None, f"{addr:#x} is not mapped"
    vma_start = int(line.split("-")[0], 16)
    for line in Path("/proc/self/numa_maps").read_text().splitlines():
        start, policy = line.split()[:2]
        if int(start, 16) == vma_start:
            return policy
    raise AssertionError(f"{vma_start:#x} not in /proc/self/numa_maps")


def test_host_is_one_node():
    # The expectations below are for the CI/dev hosts: one possible node, node 0.
    assert POSSIBLE == "0"


@pytest.mark.parametrize("backing", [Anonymous, AnonymousShm])
@pytest.mark.parametrize("prefault", [True, False])
def test_node_0_binds(linux_kernel, caplog, backing, prefault):
    a = UMBPHostMemAllocator(kernel=linux_kernel)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        h = a.alloc(MiB + 1, backing, numa_node=0, prefault=prefault)
    assert caplog.messages == []
    assert h.numa_node == 0
    assert policy_of(h.ptr) == "bind:0"
    assert a.snapshot()["live"][0]["numa_node"] == 0
    a.free(h)


def test_node_0_binds_hugetlb(nr_hugepages, linux_kernel, caplog):
    assert nr_hugepages(2) == 2
    a = UMBPHostMemAllocator(kernel=linux_kernel)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        h = a.alloc(2 * MiB, AnonymousHugetlb, numa_node=0)
    assert caplog.messages == []
    assert (h.actual_backing, h.numa_node) == (AnonymousHugetlb, 0)
    assert policy_of(h.ptr) == "bind:0"
    a.free(h)


def test_no_node_means_default_policy(linux_kernel):
    a = UMBPHostMemAllocator(kernel=linux_kernel)
    h = a.alloc(PAGE, numa_node=-1)
    assert h.numa_node == -1
    assert policy_of(h.ptr) == "default"
    a.free(h)


@pytest.mark.parametrize("node", [1, 63, 64, 1023, 5000, 2**31 - 1])
def test_node_outside_possible_is_not_bound(linux_kernel, caplog, node):
    a = UMBPHostMemAllocator(kernel=linux_kernel)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        h = a.alloc(PAGE, Anonymous, numa_node=node)
        h2 = a.alloc(PAGE, Anonymous, numa_node=node)  # once per kernel and node
    assert h and h2
    assert (h.numa_node, h2.numa_node) == (-1, -1)
    assert policy_of(h.ptr) == "default"
    assert caplog.messages == [
        f"numa_node {node} is not a possible NUMA node (possible: {POSSIBLE}); buffer not bound"
    ]
    a.free(h)
    a.free(h2)
