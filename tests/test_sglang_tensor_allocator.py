"""UMBPHostTensorAllocator against a mori-compatible double backed by real mmap/munmap.

The double records every alloc/free, so these tests assert sglang's call, texts and warnings,
and that no mapping leaks or is freed under a live tensor. The same behaviour on umbp-sim's
own allocator is in test_sglang_umbp_allocator.py.
"""

from __future__ import annotations

import ctypes
import enum
import gc
import logging
import mmap
import sys
import types
import weakref
from dataclasses import dataclass, field

import pytest

from umbp_sim.sglang.env import EnvVarError
from umbp_sim.sglang.sizing import HicacheRequest, MLAModel, hicache_request
from umbp_sim.sglang.startup import start_host_pool
from umbp_sim.sglang.tensor_allocator import (
    LOGGER_NAME,
    TorchMissingError,
    UMBPHostTensorAllocator,
)

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
MAP_FAILED = ctypes.c_void_p(-1).value

# sglang 0.5.23's warning, the backings printed with str() of mori's enum.
DEMOTED = (
    "UMBPHostTensorAllocator: requested UMBPHostBufferBacking.AnonymousHugetlb backing but kernel "
    "demoted to UMBPHostBufferBacking.Anonymous (4 KiB pages). Check vm.nr_hugepages and "
    "HugePages_Free in /proc/meminfo. Performance and AINIC MR-size benefits will not apply."
)


class UMBPHostBufferBacking(enum.Enum):
    Anonymous = 0
    AnonymousHugetlb = 1
    AnonymousShm = 2
    AnonymousShmHugetlb = 3


@dataclass
class Handle:
    ptr: int = 0
    requested_size: int = 0
    mapped_size: int = 0
    actual_backing: UMBPHostBufferBacking = UMBPHostBufferBacking.Anonymous
    actual_alignment: int = 4096

    def __bool__(self) -> bool:
        return self.ptr != 0


@dataclass
class FakeAllocator:
    """mori.umbp.UMBPHostMemAllocator over libc mmap; always demotes hugetlb to Anonymous."""

    calls: list[tuple] = field(default_factory=list)
    live: dict[int, int] = field(default_factory=dict)
    freed: list[int] = field(default_factory=list)
    fail: bool = False

    def alloc(self, size, backing=UMBPHostBufferBacking.Anonymous, hugepage_size=2097152,
              numa_node=-1, prefault=True):  # fmt: skip
        self.calls.append((size, backing, hugepage_size, numa_node, prefault))
        if self.fail or size == 0:
            return Handle()
        mapped = -(-size // 4096) * 4096
        ptr = libc.mmap(None, mapped, mmap.PROT_READ | mmap.PROT_WRITE,
                        mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)  # fmt: skip
        assert ptr != MAP_FAILED
        self.live[ptr] = mapped
        return Handle(ptr, size, mapped, UMBPHostBufferBacking.Anonymous, 4096)

    def free(self, handle: Handle) -> None:
        mapped = self.live.pop(handle.ptr)  # KeyError on double free
        assert libc.munmap(handle.ptr, mapped) == 0
        self.freed.append(handle.ptr)


def fake_module() -> tuple[object, list[FakeAllocator]]:
    made: list[FakeAllocator] = []

    class Module:
        UMBPHostBufferBacking = UMBPHostBufferBacking

        @staticmethod
        def UMBPHostMemAllocator() -> FakeAllocator:  # noqa: N802 - mori's name
            a = FakeAllocator()
            made.append(a)
            return a

    return Module, made


def make(env: dict[str, str] | None = None) -> tuple[UMBPHostTensorAllocator, FakeAllocator]:
    mod, made = fake_module()
    alloc = UMBPHostTensorAllocator(env or {}, module=mod)
    return alloc, made[0]


@pytest.mark.torch
def test_allocate_returns_tensor_over_the_handle() -> None:
    import torch

    a, fake = make()
    t = a.allocate((2, 3, 4), torch.bfloat16)
    size, backing, hp, node, prefault = fake.calls[0]
    assert (size, backing, hp, node, prefault) == (
        48,
        UMBPHostBufferBacking.AnonymousHugetlb,
        2097152,
        -1,
        True,
    )
    assert t.shape == (2, 3, 4) and t.dtype == torch.bfloat16
    assert t.data_ptr() == next(iter(fake.live))
    t.fill_(1.5)
    assert float(t.sum()) == 36.0
    raw = (ctypes.c_uint16 * 24).from_address(t.data_ptr())
    assert raw[0] == 0x3FC0  # bf16 1.5, written through the mapping
    assert (a.dims, a.dtype) == ((2, 3, 4), torch.bfloat16)
    a.close()


@pytest.mark.torch
def test_env_reaches_the_alloc_call() -> None:
    import torch

    env = {
        "SGLANG_HICACHE_HOST_HUGEPAGE": "off",
        "SGLANG_HICACHE_HOST_HUGEPAGE_SIZE": "1073741824",
        "SGLANG_HICACHE_HOST_NUMA_NODE": "1",
        "SGLANG_HICACHE_HOST_PREFAULT": "0",
    }
    a, fake = make(env)
    a.allocate((8,), torch.uint8)
    assert fake.calls == [(8, UMBPHostBufferBacking.Anonymous, 1073741824, 1, False)]
    a.close()


@pytest.mark.torch  # the allocator needs torch before it reads the environment
def test_invalid_env_is_a_clear_error_naming_the_variable() -> None:
    mod, made = fake_module()
    with pytest.raises(EnvVarError, match="^SGLANG_HICACHE_HOST_HUGEPAGE_SIZE='2M' is not an"):
        UMBPHostTensorAllocator({"SGLANG_HICACHE_HOST_HUGEPAGE_SIZE": "2M"}, module=mod)
    assert made[0].live == {}


@pytest.mark.torch
def test_null_handle_runtime_error_text() -> None:
    import torch

    a, fake = make({"SGLANG_HICACHE_HOST_NUMA_NODE": "3"})
    fake.fail = True
    with pytest.raises(RuntimeError) as ei:
        a.allocate((762944 * 2, 32, 8, 128), torch.bfloat16)
    assert str(ei.value) == (
        "UMBPHostMemAllocator.alloc(100000595968 bytes) failed "
        "(requested_backing=UMBPHostBufferBacking.AnonymousHugetlb, numa_node=3)."
    )
    assert a.handles == ()


@pytest.mark.torch
def test_zero_sized_pool_is_the_same_runtime_error() -> None:
    import torch

    a, _ = make()
    with pytest.raises(RuntimeError, match=r"^UMBPHostMemAllocator\.alloc\(0 bytes\) failed"):
        a.allocate((0, 4), torch.float16)


@pytest.mark.torch
def test_cpu_only() -> None:
    import torch

    a, fake = make()
    with pytest.raises(ValueError) as ei:
        a.allocate((4,), torch.uint8, device="cuda")
    assert str(ei.value) == (
        "UMBPHostTensorAllocator only supports CPU host memory, got device=cuda"
    )
    assert fake.calls == []


@pytest.mark.torch
def test_demotion_warning_and_info_log(caplog: pytest.LogCaptureFixture) -> None:
    import torch

    assert LOGGER_NAME == "sglang.srt.mem_cache.storage.umbp.umbp_host_allocator"
    a, fake = make()
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        a.allocate((4096,), torch.uint8)
    records = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    ptr = next(iter(fake.live))
    assert records == [
        (
            LOGGER_NAME,
            "INFO",
            f"UMBPHostTensorAllocator: allocated 0.00 GB at 0x{ptr:x} "
            "requested_backing=UMBPHostBufferBacking.AnonymousHugetlb "
            "actual_backing=UMBPHostBufferBacking.Anonymous actual_alignment=4096 "
            "mapped_size=4096 numa_node=-1",
        ),
        (LOGGER_NAME, "WARNING", DEMOTED),
    ]
    assert "vm.nr_hugepages" in DEMOTED and "HugePages_Free" in DEMOTED
    # Asked for 4 KiB pages and got them: no warning.
    caplog.clear()
    b, _ = make({"SGLANG_HICACHE_HOST_HUGEPAGE": "0"})
    with caplog.at_level(logging.WARNING, logger=LOGGER_NAME):
        b.allocate((4096,), torch.uint8)
    assert caplog.records == []
    a.close()
    b.close()


@pytest.mark.torch
def test_mla_kv_split_three_allocations_no_leak() -> None:
    """The MLA page_first_kv_split layout: three allocate() calls on one allocator."""
    import torch

    model = MLAModel(2, 512, 64, "bfloat16", index_head_dim=128)
    req = hicache_request(model, hicache_size=0, device_pool_tokens=100, page_size=64,
                          layout="page_first_kv_split")  # fmt: skip
    a, fake = make()
    tensors = [a.allocate(b.dims, torch.bfloat16) for b in req.buffers]
    assert [t.shape for t in tensors] == [torch.Size(b.dims) for b in req.buffers]
    assert [c[0] for c in fake.calls] == [b.nbytes for b in req.buffers]
    assert len(fake.live) == 3 and len(a.handles) == 3 and len(a.owned_handles) == 3
    del tensors
    a.close()
    assert fake.live == {} and len(fake.freed) == 3
    assert a.handles == () and a.free_errors == []
    a.close()  # idempotent
    assert len(fake.freed) == 3
    with pytest.raises(RuntimeError, match=r"allocate\(\) called after close\(\)"):
        a.allocate((1,), torch.uint8)


@pytest.mark.torch
def test_close_never_frees_under_a_live_tensor() -> None:
    import torch

    a, fake = make()
    t = a.allocate((1024,), torch.int32)
    view = t[10:20]
    ptr = t.data_ptr()
    del t
    a.close()
    assert ptr in fake.live and fake.freed == []  # a view still uses it
    assert a.owned_handles == () and len(a.handles) == 1
    view.fill_(7)  # still mapped: writing is safe
    assert int(view.sum()) == 70
    del view
    assert fake.live == {} and fake.freed == [ptr]
    assert a.handles == ()


@pytest.mark.torch
def test_garbage_collection_frees_everything() -> None:
    import torch

    a, fake = make()
    a.allocate((4096,), torch.uint8)
    a.allocate((8192,), torch.uint8)  # results dropped: only the allocator holds them
    assert len(fake.live) == 2
    ref = weakref.ref(a)
    del a
    gc.collect()
    assert ref() is None
    assert fake.live == {} and len(fake.freed) == 2


@pytest.mark.torch
def test_garbage_collection_waits_for_tensors() -> None:
    import torch

    a, fake = make()
    t = a.allocate((16,), torch.float32)
    del a
    gc.collect()
    assert len(fake.live) == 1
    t += 1
    del t
    assert fake.live == {}


@pytest.mark.torch
def test_free_failure_is_recorded_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    import torch

    a, fake = make()
    a.allocate((4096,), torch.uint8)
    ptr = next(iter(fake.live))
    fake.free(Handle(ptr))  # freed behind the allocator's back: its own free will fail
    with caplog.at_level(logging.ERROR, logger=LOGGER_NAME):
        a.close()
    assert a.free_errors == [f"UMBPHostMemAllocator.free(ptr=0x{ptr:x}) failed: KeyError: {ptr}"]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == a.free_errors


@pytest.mark.torch
def test_bool_env_surprise_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    import torch

    with caplog.at_level(logging.WARNING, logger="umbp_sim.sglang"):
        a, fake = make({"SGLANG_HICACHE_HOST_HUGEPAGE": "enabled"})
    # umbp-sim's note, under its own logger: sglang itself logs nothing for it
    assert [r.getMessage() for r in caplog.records if r.name == "umbp_sim.sglang"] == [
        "SGLANG_HICACHE_HOST_HUGEPAGE='enabled' is not one of 1/true/yes/on "
        "(or 0/false/no/off): sglang reads it as off"
    ]
    a.allocate((1,), torch.uint8)
    assert fake.calls[0][1] is UMBPHostBufferBacking.Anonymous
    a.close()


def test_torch_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    mod, _ = fake_module()
    monkeypatch.setitem(sys.modules, "torch", None)  # "import torch" now raises ImportError
    with pytest.raises(TorchMissingError) as ei:
        UMBPHostTensorAllocator({}, module=mod)
    assert isinstance(ei.value, ImportError)  # sglang's caller would fall back on it
    assert str(ei.value) == (
        "torch is required for UMBPHostTensorAllocator "
        "(install torch, e.g. pip install 'umbp-sim[torch]')"
    )


# ---- start_host_pool: sglang's startup order, reported ----------------------------------------

BIG_HOST = {"MemTotal": 64 << 20, "MemFree": 60 << 20, "MemAvailable": 60 << 20}  # 64 GiB


def small_request(layout: str = "page_first_kv_split") -> HicacheRequest:
    model = MLAModel(2, 512, 64, "bfloat16", index_head_dim=128)
    return hicache_request(model, device_pool_tokens=100, page_size=64, layout=layout)


@pytest.mark.torch  # start_host_pool makes torch tensors
def test_startup_demoted_and_freed() -> None:
    mod, made = fake_module()
    r = start_host_pool(small_request(), BIG_HOST, env={}, module=mod)
    assert (r.outcome, r.stage, r.error) == ("demoted", "done", None)
    assert r.warnings == [DEMOTED] * 3
    assert len(r.handles) == 3
    assert made[0].live == {} and len(made[0].freed) == 3  # keep=False frees
    r2 = start_host_pool(small_request("layer_first"), BIG_HOST, env={}, module=mod, keep=True)
    assert r2.outcome == "demoted" and len(r2.tensors) == 1
    assert r2.tensors[0].shape == small_request("layer_first").dims[0]
    assert len(made[1].live) == 1
    r2.close()
    assert made[1].live == {}


@pytest.mark.torch  # start_host_pool makes torch tensors
def test_startup_ok_without_hugepages() -> None:
    mod, _ = fake_module()
    r = start_host_pool(small_request(), BIG_HOST, env={"SGLANG_HICACHE_HOST_HUGEPAGE": "0"},
                        module=mod)  # fmt: skip
    assert (r.outcome, r.warnings) == ("ok", [])


@pytest.mark.torch  # start_host_pool makes torch tensors
def test_startup_host_check_failure() -> None:
    mod, made = fake_module()
    tiny = {"MemTotal": 12 << 20, "MemFree": 11 << 20, "MemAvailable": 10 << 20}  # 10 GiB
    r = start_host_pool(small_request(), tiny, env={}, module=mod)
    assert (r.outcome, r.stage) == ("failed", "host_check")
    assert r.error == (
        "ValueError: Not enough host memory available. Requesting 0.00 GB but only have "
        "0.00 GB free. Please reduce the size of the hierarchical cache."
    )
    assert made[0].calls == []


@pytest.mark.torch  # start_host_pool makes torch tensors
def test_startup_null_handle_and_env_death() -> None:
    mod, made = fake_module()
    failing = types.SimpleNamespace(
        UMBPHostBufferBacking=UMBPHostBufferBacking,
        UMBPHostMemAllocator=lambda: FakeAllocator(fail=True),
    )
    r = start_host_pool(
        small_request(), BIG_HOST, env={"SGLANG_HICACHE_HOST_NUMA_NODE": "3"}, module=failing
    )
    assert (r.outcome, r.stage) == ("failed", "allocate")
    nbytes = small_request().buffers[0].nbytes
    assert r.error == (
        f"RuntimeError: UMBPHostMemAllocator.alloc({nbytes} bytes) failed "
        "(requested_backing=UMBPHostBufferBacking.AnonymousHugetlb, numa_node=3)."
    )
    r = start_host_pool(small_request(), BIG_HOST,
                        env={"SGLANG_HICACHE_HOST_HUGEPAGE_SIZE": "2M"}, module=mod)  # fmt: skip
    assert (r.outcome, r.stage) == ("failed", "allocator")
    assert r.error == "ValueError: invalid literal for int() with base 10: '2M'"
    assert made == []  # sglang died before any allocation


@pytest.mark.torch  # start_host_pool makes torch tensors
def test_startup_falls_back_when_allocator_unavailable() -> None:
    class Broken:
        UMBPHostBufferBacking = UMBPHostBufferBacking

        @staticmethod
        def UMBPHostMemAllocator() -> None:  # noqa: N802
            raise RuntimeError("mori.umbp is not available")

    r = start_host_pool(small_request(), BIG_HOST, env={}, module=Broken)
    assert (r.outcome, r.stage) == ("fallback", "done")
    assert r.warnings == [
        "UMBPHostTensorAllocator unavailable (mori.umbp is not available). "
        "Falling back to torch.empty-based allocator."
    ]
