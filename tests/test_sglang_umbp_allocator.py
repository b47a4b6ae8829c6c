"""sglang's caller on umbp-sim's own allocator (real kernel): texts, demotion, no leaks.

Hugetlb pools are global and other tests change them (possibly concurrently, under xdist), so
demotion is exercised with 4 MiB pages (``SGLANG_HICACHE_HOST_HUGEPAGE_SIZE=4194304``), a size
no x86_64 or arm64-4K kernel has a pool for: the hugetlb mmap fails with EINVAL whatever the
sysctls say. Everything else asks for 4 KiB pages.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import sys
from pathlib import Path

import pytest

import umbp_sim
from umbp_sim.mori_compat import mori_umbp
from umbp_sim.sglang import (
    LOGGER_NAME,
    MLAModel,
    UMBPHostTensorAllocator,
    hicache_request,
    start_host_pool,
)

TESTS = Path(__file__).parent
BIG_HOST = {"MemTotal": 64 << 20, "MemFree": 60 << 20, "MemAvailable": 60 << 20}

# sglang 0.5.23's warning, the backings printed with str() of mori's enum.
DEMOTED = (
    "UMBPHostTensorAllocator: requested UMBPHostBufferBacking.AnonymousHugetlb backing but kernel "
    "demoted to UMBPHostBufferBacking.Anonymous (4 KiB pages). Check vm.nr_hugepages and "
    "HugePages_Free in /proc/meminfo. Performance and AINIC MR-size benefits will not apply."
)


DEMOTE = {"SGLANG_HICACHE_HOST_HUGEPAGE_SIZE": "4194304"}
NO_HUGE = {"SGLANG_HICACHE_HOST_HUGEPAGE": "0"}


def live_ptrs(a: UMBPHostTensorAllocator) -> set[int]:
    return {int(h.ptr) for h in a.handles}


def kernel_live_ptrs() -> set[int]:
    """Every live buffer on the process's real kernel (all allocators share its table)."""
    return {b["ptr"] for b in umbp_sim.UMBPHostMemAllocator().snapshot()["live"]}


def test_backing_prints_as_in_the_field_report() -> None:
    assert str(umbp_sim.UMBPHostBufferBacking.AnonymousHugetlb) == (
        "UMBPHostBufferBacking.AnonymousHugetlb"
    )


@pytest.mark.torch
def test_tensor_over_a_real_handle_and_demotion(caplog: pytest.LogCaptureFixture) -> None:
    import torch

    with caplog.at_level(logging.WARNING, logger=LOGGER_NAME):
        a = UMBPHostTensorAllocator(DEMOTE)
        t = a.allocate((4, 1024), torch.float32)
    (h,) = a.handles
    assert t.data_ptr() == int(h.ptr)
    assert h.actual_backing == umbp_sim.UMBPHostBufferBacking.Anonymous
    assert h.requested_size == 16384
    ours = [r.getMessage() for r in caplog.records if r.name == LOGGER_NAME]
    assert ours == [DEMOTED]
    t.fill_(2.0)
    assert ctypes.c_float.from_address(int(h.ptr) + 4 * 4095).value == 2.0
    del t
    a.close()
    assert a.handles == ()


@pytest.mark.torch
def test_null_handle_texts_on_the_real_allocator() -> None:
    import torch

    a = UMBPHostTensorAllocator({})
    with pytest.raises(RuntimeError) as ei:
        a.allocate((0, 8), torch.bfloat16)
    assert str(ei.value) == (
        "UMBPHostMemAllocator.alloc(0 bytes) failed "
        "(requested_backing=UMBPHostBufferBacking.AnonymousHugetlb, numa_node=-1)."
    )
    b = UMBPHostTensorAllocator(
        {"SGLANG_HICACHE_HOST_HUGEPAGE": "no", "SGLANG_HICACHE_HOST_NUMA_NODE": "1"}
    )
    with pytest.raises(RuntimeError) as ei:
        b.allocate((0,), torch.uint8)
    assert str(ei.value) == (
        "UMBPHostMemAllocator.alloc(0 bytes) failed "
        "(requested_backing=UMBPHostBufferBacking.Anonymous, numa_node=1)."
    )
    assert a.handles == () and b.handles == ()


@pytest.mark.torch
def test_mla_kv_split_repeated_allocate_does_not_leak() -> None:
    import torch

    model = MLAModel(4, 512, 64, "bfloat16", index_head_dim=128)
    req = hicache_request(
        model, device_pool_tokens=1000, page_size=64, layout="page_first_kv_split"
    )
    before = kernel_live_ptrs()
    a = UMBPHostTensorAllocator(NO_HUGE)
    tensors = [a.allocate(b.dims, torch.bfloat16) for b in req.buffers]
    assert len(live_ptrs(a)) == 3
    assert {t.data_ptr() for t in tensors} == live_ptrs(a)
    assert kernel_live_ptrs() == before | live_ptrs(a)
    del tensors
    a.close()
    assert a.handles == () and a.free_errors == []
    assert kernel_live_ptrs() == before


@pytest.mark.torch
def test_close_keeps_mapping_under_a_live_tensor() -> None:
    import torch

    a = UMBPHostTensorAllocator(NO_HUGE)
    t = a.allocate((1 << 20,), torch.uint8)
    a.close()
    assert len(a.handles) == 1
    t[-1] = 7  # would SIGSEGV if the mapping had been freed
    assert int(t[-1]) == 7
    del t
    assert a.handles == ()


@pytest.mark.torch  # start_host_pool makes torch tensors
def test_start_host_pool_on_the_real_allocator() -> None:
    req = hicache_request(
        MLAModel(2, 512, 64, "bfloat16", index_head_dim=128),
        device_pool_tokens=100,
        page_size=64,
        layout="page_first_kv_split",
    )
    r = start_host_pool(req, BIG_HOST, env=DEMOTE)
    assert (r.outcome, r.stage, r.error) == ("demoted", "done", None)
    assert [w for w in r.warnings if w.startswith("UMBPHostTensorAllocator")] == ([DEMOTED] * 3)
    assert r.allocator is not None and r.allocator.handles == ()
    ok = start_host_pool(req, BIG_HOST, env=NO_HUGE)
    assert (ok.outcome, ok.warnings) == ("ok", [])
    assert [h.actual_backing for h in ok.handles] == [umbp_sim.UMBPHostBufferBacking.Anonymous] * 3


def test_unmodified_mori_caller_runs_on_umbp_sim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(TESTS))
    with mori_umbp():
        caller = importlib.import_module("mori_caller")
        ok, backing, size = caller.alloc_write_free(12345)
    assert ok and size == 12345
    assert backing == umbp_sim.UMBPHostBufferBacking.Anonymous
    assert "mori_caller" not in sys.modules and "mori" not in sys.modules
