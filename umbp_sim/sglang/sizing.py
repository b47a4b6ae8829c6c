"""HiCache host-pool sizing exactly as sglang computes it, before the allocator is called.

Mirrors ``HostKVCache.__init__`` / ``MHATokenToKVPoolHost`` / ``MLATokenToKVPoolHost`` in
sglang (``python/sglang/srt/mem_cache/pool_host/{base,mha,mla}.py``; earlier
``memory_pool_host.py``) and the behaviour written down in docs/field-failures.md:

- bytes per token: MHA ``head_dim * kv_heads * layers * itemsize * 2``;
  MLA ``(kv_lora_rank + qk_rope_head_dim) * itemsize * layers``;
- tokens: ``int(hicache_size * 1e9 // bytes_per_token)`` when ``hicache_size > 0``, else
  ``int(device_pool_tokens * hicache_ratio)``; then ``page_num = tokens // page_size + 1`` and
  ``tokens = page_num * page_size`` (always one extra page);
- the host check: ``tokens * bytes_per_token`` must be <= ``MemAvailable - 10 GiB``.

This module must not import torch (a tox env runs without it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from umbp_sim.sglang.host_memory import (
    HICACHE_HOST_MEMORY_RESERVE_BYTES,
    check_host_memory,
    host_available_bytes,
    host_memory_budget,
    host_memory_error,
    hugetlb_pool_bytes,
    mem_field,
    parse_meminfo,
    read_meminfo,
)
from umbp_sim.sglang.kv_model import (
    DTYPE_ITEMSIZE,
    MHA_LAYOUTS,
    MLA_LAYOUTS,
    MHAModel,
    MLAModel,
    Model,
    SizingError,
    _positive_int,
    dtype_itemsize,
    kv_heads_per_rank,
    mha_bytes_per_token,
    mla_bytes_per_token,
)
from umbp_sim.vocabulary.bounded import shown

__all__ = [
    "DTYPE_ITEMSIZE",
    "HICACHE_HOST_MEMORY_RESERVE_BYTES",
    "MHA_LAYOUTS",
    "MLA_LAYOUTS",
    "BufferSpec",
    "HicacheRequest",
    "MHAModel",
    "MLAModel",
    "Model",
    "SizingError",
    "check_host_memory",
    "check_request",
    "dtype_itemsize",
    "hicache_request",
    "hicache_request_of_table",
    "host_available_bytes",
    "host_memory_budget",
    "host_memory_error",
    "host_pool_tokens",
    "hugetlb_pool_bytes",
    "kv_buffers",
    "kv_heads_per_rank",
    "largest_hicache_size_that_fits",
    "mem_field",
    "mha_bytes_per_token",
    "mla_bytes_per_token",
    "parse_meminfo",
    "read_meminfo",
]


def host_pool_tokens(
    bytes_per_token: int,
    page_size: int,
    *,
    hicache_size: int | float = 0,
    hicache_ratio: float = 2.0,
    device_pool_tokens: int | None = None,
) -> tuple[int, int]:
    """(tokens, page_num) of the host pool, with sglang's arithmetic and its extra page.

    ``hicache_size`` (GB, 10**9 bytes) wins when > 0, as in sglang; otherwise the pool is
    ``device_pool_tokens * hicache_ratio`` tokens. The expressions are sglang's own (float
    ``1e9`` and ``//``); for integer sizes below 2**53 bytes they equal exact integer arithmetic.
    """
    _positive_int(bytes_per_token, "bytes_per_token")
    _positive_int(page_size, "page_size")
    if isinstance(hicache_size, bool) or not isinstance(hicache_size, (int, float)):
        raise SizingError(f"hicache_size: expected a number of GB, got {shown(hicache_size)}")
    if hicache_size < 0:
        raise SizingError(f"hicache_size: must be >= 0, got {hicache_size}")
    if hicache_size > 0:
        size = int(hicache_size * 1e9 // bytes_per_token)
    else:
        if device_pool_tokens is None:
            raise SizingError(
                "device_pool_tokens: required when hicache_size is 0 (the pool is then "
                "device_pool_tokens * hicache_ratio)"
            )
        _positive_int(device_pool_tokens, "device_pool_tokens", allow_zero=True)
        if isinstance(hicache_ratio, bool) or not isinstance(hicache_ratio, (int, float)):
            raise SizingError(f"hicache_ratio: expected a number, got {shown(hicache_ratio)}")
        if hicache_ratio < 0:
            raise SizingError(f"hicache_ratio: must be >= 0, got {hicache_ratio}")
        size = int(device_pool_tokens * hicache_ratio)
    # "Align up the host memory pool size to the page size": always one more page.
    page_num = size // page_size + 1
    return page_num * page_size, page_num


@dataclass(frozen=True)
class BufferSpec:
    """One ``allocator.allocate(dims, dtype)`` call the host pool makes."""

    name: str
    dims: tuple[int, ...]
    itemsize: int

    @property
    def nbytes(self) -> int:
        n = self.itemsize
        for d in self.dims:
            n *= d
        return n


def kv_buffers(
    model: Model, layout: str, tokens: int, page_num: int, page_size: int
) -> tuple[BufferSpec, ...]:
    """The buffers (dims per layout) sglang's init_kv_buffer allocates, in allocation order."""
    isz = model.itemsize
    if isinstance(model, MHAModel):
        L, H, D = model.layers, model.kv_heads, model.head_dim
        if layout == "layer_first":
            dims: tuple[int, ...] = (2, L, tokens, H, D)
        elif layout == "page_first":
            dims = (2, tokens, L, H, D)
        elif layout == "page_first_direct":
            dims = (2, page_num, L, page_size, H, D)
        elif layout == "page_head":
            dims = (2, page_num, H, page_size, L, D)
        else:
            raise SizingError(
                f"layout: Unsupported layout: {layout} (MHA supports {', '.join(MHA_LAYOUTS)})"
            )
        return (BufferSpec("kv_buffer", dims, isz),)
    L, C = model.layers, model.kv_cache_dim
    if layout == "layer_first":
        return (BufferSpec("kv_buffer", (L, tokens, 1, C), isz),)
    if layout == "page_first":
        return (BufferSpec("kv_buffer", (tokens, L, 1, C), isz),)
    if layout == "page_first_direct":
        return (BufferSpec("kv_buffer", (page_num, L, page_size, 1, C), isz),)
    if layout == "page_first_kv_split":
        base = (page_num, L, page_size, 1)
        specs = [
            BufferSpec("k_buffer", (*base, model.kv_lora_rank), isz),
            BufferSpec("v_buffer", (*base, model.qk_rope_head_dim), isz),
        ]
        if model.index_head_dim is not None:
            specs.append(BufferSpec("index_k_buffer", (*base, model.index_head_dim), isz))
        return tuple(specs)
    raise SizingError(
        f"layout: Unsupported layout: {layout} (MLA supports {', '.join(MLA_LAYOUTS)})"
    )


@dataclass(frozen=True)
class HicacheRequest:
    """What one rank's HiCache host pool asks for.

    ``nbytes`` is what sglang's host-memory check compares (``tokens * bytes_per_token``);
    ``buffers`` are the allocations that follow, whose sum (``allocated_bytes``) exceeds
    ``nbytes`` only for MLA ``page_first_kv_split`` with an indexer.
    """

    model: Model
    layout: str
    page_size: int
    bytes_per_token: int
    tokens: int
    page_num: int
    nbytes: int
    buffers: tuple[BufferSpec, ...] = field(default_factory=tuple)
    hicache_size: int | float = 0
    hicache_ratio: float = 2.0
    device_pool_tokens: int | None = None

    @property
    def allocated_bytes(self) -> int:
        return sum(b.nbytes for b in self.buffers)

    @property
    def dims(self) -> tuple[tuple[int, ...], ...]:
        return tuple(b.dims for b in self.buffers)


def hicache_request(
    model: Model,
    *,
    layout: str = "layer_first",
    page_size: int = 1,
    hicache_size: int | float = 0,
    hicache_ratio: float = 2.0,
    device_pool_tokens: int | None = None,
) -> HicacheRequest:
    """Bytes per token, tokens, nbytes per rank and the dims of every buffer, as sglang sizes them.

    Defaults are sglang's: ``--page-size 1``, ``--hicache-ratio 2.0``, ``--hicache-size 0``,
    ``--hicache-mem-layout layer_first``.
    """
    bpt = model.bytes_per_token
    tokens, page_num = host_pool_tokens(
        bpt,
        page_size,
        hicache_size=hicache_size,
        hicache_ratio=hicache_ratio,
        device_pool_tokens=device_pool_tokens,
    )
    return HicacheRequest(
        model=model,
        layout=layout,
        page_size=page_size,
        bytes_per_token=bpt,
        tokens=tokens,
        page_num=page_num,
        nbytes=tokens * bpt,
        buffers=kv_buffers(model, layout, tokens, page_num, page_size),
        hicache_size=hicache_size,
        hicache_ratio=hicache_ratio,
        device_pool_tokens=device_pool_tokens,
    )


def hicache_request_of_table(r: Mapping[str, Any]) -> HicacheRequest:
    """The host pool of a scenario-style table (a scenario's ``[request]`` with kind "sglang", a
    replay's sglang flags): MLA when ``kv_lora_rank`` is given, else MHA with ``kv_heads`` split
    by ``tp_size``. Raises KeyError, ValueError, TypeError or SizingError on a bad table."""
    dtype = r.get("dtype", "bfloat16")
    model: Model
    if "kv_lora_rank" in r:
        model = MLAModel(r["layers"], r["kv_lora_rank"], r.get("qk_rope_head_dim", 64), dtype,
                         r.get("index_head_dim"))  # fmt: skip
    else:
        heads = kv_heads_per_rank(r["kv_heads"], r["tp_size"]) if "tp_size" in r else r["kv_heads"]
        model = MHAModel(r["layers"], heads, r["head_dim"], dtype)
    return hicache_request(
        model,
        layout=r.get("layout", "layer_first"),
        page_size=r.get("page_size", 1),
        hicache_size=r.get("hicache_size", 0),
        hicache_ratio=r.get("hicache_ratio", 2.0),
        device_pool_tokens=r.get("device_pool_tokens"),
    )


def largest_hicache_size_that_fits(
    bytes_per_token: int, page_size: int, budget_bytes: int
) -> int | None:
    """The largest integer ``--hicache-size`` (GB) whose nbytes is <= ``budget_bytes``.

    None when even 1 GB does not fit (``--hicache-size 0`` means "use the ratio", not "none").
    Exact: nbytes(s) = ((s*10**9 // bpt) // ps + 1) * ps * bpt is non-decreasing in s, and
    tokens <= T = budget // bpt  <=>  s*10**9 // bpt < (T // ps) * ps.
    """
    _positive_int(bytes_per_token, "bytes_per_token")
    _positive_int(page_size, "page_size")
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int):
        raise SizingError(f"budget_bytes: expected an integer, got {shown(budget_bytes)}")
    if budget_bytes <= 0:
        return None
    max_tokens_allowed = (budget_bytes // bytes_per_token // page_size) * page_size
    if max_tokens_allowed == 0:
        return None
    s = (max_tokens_allowed * bytes_per_token - 1) // 10**9
    return s if s >= 1 else None


def check_request(
    request: HicacheRequest, meminfo: Mapping[str, int] | str | os.PathLike[str]
) -> None:
    """sglang's check for one rank's request against a host's meminfo."""
    check_host_memory(request.nbytes, host_memory_budget(meminfo))
