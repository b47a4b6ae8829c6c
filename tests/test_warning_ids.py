"""Warnings carry stable ids beside their text (csrc/allocator/warning_texts.h): the built-in
allocators log them as ``warning_id``, LogCapture keeps them, and an external build's line finds
its id by matching the catalogues (umbp_sim.vocabulary.warning_ids)."""

from __future__ import annotations

import logging

import pytest

import umbp_sim._native as _native
from umbp_sim.allocator import Anonymous, AnonymousHugetlb, UMBPHostMemAllocator
from umbp_sim.machine import Machine
from umbp_sim.sim import SimHost, build_kernel
from umbp_sim.vocabulary.log_capture import capture_logs
from umbp_sim.vocabulary.warning_ids import warning_id

MiB = 1 << 20


def test_ids_are_unique_and_stable_kebab_case():
    entries = _native.warning_catalogue()
    ids = [wid for _, wid, _ in entries]
    assert len(ids) == len(set(ids))
    assert all(wid == wid.lower() and " " not in wid for wid in ids)
    assert {c for c, _, _ in entries} == {"umbp-sim", "mori"}
    assert all(wid.startswith("mori-") for c, wid, _ in entries if c == "mori")


@pytest.mark.parametrize(
    ("profile", "node", "wid"),
    [("umbp-sim", 5, "numa-node-not-possible"), ("mori-624002c", 63, "mori-mbind-failed")],
)
def test_the_record_carries_the_id_and_the_capture_keeps_it(profile, node, wid):
    m = Machine.x86_64(hugepages={"2MiB": 16})
    alloc = UMBPHostMemAllocator(build_kernel(m), profile)
    with capture_logs(["umbp_sim.allocator"], logging.INFO) as logs:
        h = alloc.alloc(4 * MiB, Anonymous, numa_node=node)
    assert h and h.numa_node == -1
    [(logger, got, text)] = logs.log
    assert (logger, got) == ("umbp_sim.allocator", wid)
    assert warning_id(text) == wid  # the same id from the text alone (an external build's)


def test_an_external_line_finds_its_id_by_template():
    line = (
        "HostMemAllocator: MAP_HUGETLB allocation failed for size=1 hugepage_size=2097152 "
        "(12: Cannot allocate memory); falling back to anonymous pages. HugePages_Total: 0 "
        "HugePages_Free: 0 Hugepagesize: 2048 kB"
    )
    assert warning_id(line) == "mori-hugetlb-fallback"
    assert warning_id("HostMemAllocator: something else") is None
    assert warning_id("mbind( failed somewhere") is None  # prose alone selects nothing


def test_the_fallback_warning_of_each_allocator_has_its_id():
    for profile, wid in (("umbp-sim", "hugetlb-fallback-mmap"), ("mori", "mori-hugetlb-fallback")):
        m = Machine.x86_64()
        host = SimHost(m, build_kernel(m))
        alloc = UMBPHostMemAllocator(host.kernel, profile)
        with capture_logs(["umbp_sim.allocator"]) as logs:
            assert alloc.alloc(4 * MiB, AnonymousHugetlb).actual_backing == Anonymous
        assert [wid for _, wid, _ in logs.log] == [wid]
