"""HiCache host-pool sizing exactly as sglang computes it, before the allocator is called.

Mirrors ``HostKVCache.__init__`` / ``MHATokenToKVPoolHost`` / ``MLATokenToKVPoolHost`` in
sglang (``python/sglang/srt/mem_cache/pool_host/{base,mha,mla}.py``; earlier
``memory_pool_host.py``) and the behaviour written down in shared/field-failures.md:

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

from umbp_sim.meminfo import meminfo_lines

# sglang: HICACHE_HOST_MEMORY_RESERVE_BYTES = 10 * (1024**3), left for the OS and other processes.
HICACHE_HOST_MEMORY_RESERVE_BYTES = 10 * (1 << 30)

MHA_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")
MLA_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_first_kv_split")

# torch dtype name -> itemsize. fp8 KV caches are stored as uint8 in sglang (itemsize 1 either way).
DTYPE_ITEMSIZE = {
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "float32": 4,
    "float": 4,
    "float64": 8,
    "double": 8,
    "float8_e4m3fn": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2": 1,
    "float8_e5m2fnuz": 1,
    "uint8": 1,
    "int8": 1,
}


class SizingError(ValueError):
    """Bad sizing input (unknown dtype or layout, negative dims); the message names the argument."""


def dtype_itemsize(dtype: object) -> int:
    """Bytes per element of ``dtype``: a name ("bfloat16", "torch.float16") or a torch dtype."""
    itemsize = getattr(dtype, "itemsize", None)
    if isinstance(itemsize, int) and not isinstance(dtype, str):
        return itemsize
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPE_ITEMSIZE:
        known = ", ".join(sorted(DTYPE_ITEMSIZE))
        raise SizingError(f"dtype: unknown dtype {dtype!r} (known: {known})")
    return DTYPE_ITEMSIZE[name]


def _positive_int(value: object, what: str, *, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SizingError(f"{what}: expected an integer, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise SizingError(f"{what}: must be {'>= 0' if allow_zero else '> 0'}, got {value}")
    return value


@dataclass(frozen=True)
class MHAModel:
    """What an MHA host pool needs per rank: kv_heads is the heads this rank holds."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        _positive_int(self.layers, "layers")
        _positive_int(self.kv_heads, "kv_heads")
        _positive_int(self.head_dim, "head_dim")
        dtype_itemsize(self.dtype)

    @property
    def kind(self) -> str:
        return "mha"

    @property
    def itemsize(self) -> int:
        return dtype_itemsize(self.dtype)

    @property
    def bytes_per_token(self) -> int:
        return mha_bytes_per_token(self.layers, self.kv_heads, self.head_dim, self.itemsize)


@dataclass(frozen=True)
class MLAModel:
    """What an MLA host pool needs per rank (DeepSeek: kv_lora_rank 512, qk_rope_head_dim 64).

    ``index_head_dim`` is the DSA indexer's K width (DeepSeek V3.2: 128): only the
    ``page_first_kv_split`` layout allocates it, as a third buffer, and sglang's size per token
    (hence the host check) does not count it.
    """

    layers: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    dtype: str = "bfloat16"
    index_head_dim: int | None = None
    override_kv_cache_dim: int | None = None

    def __post_init__(self) -> None:
        _positive_int(self.layers, "layers")
        _positive_int(self.kv_lora_rank, "kv_lora_rank")
        _positive_int(self.qk_rope_head_dim, "qk_rope_head_dim")
        if self.index_head_dim is not None:
            _positive_int(self.index_head_dim, "index_head_dim")
        if self.override_kv_cache_dim is not None:
            _positive_int(self.override_kv_cache_dim, "override_kv_cache_dim")
        dtype_itemsize(self.dtype)

    @property
    def kind(self) -> str:
        return "mla"

    @property
    def itemsize(self) -> int:
        return dtype_itemsize(self.dtype)

    @property
    def kv_cache_dim(self) -> int:
        # sglang: override_kv_cache_dim or (kv_lora_rank + qk_rope_head_dim)
        return self.override_kv_cache_dim or (self.kv_lora_rank + self.qk_rope_head_dim)

    @property
    def bytes_per_token(self) -> int:
        return self.kv_cache_dim * self.itemsize * self.layers


Model = MHAModel | MLAModel


def mha_bytes_per_token(layers: int, kv_heads: int, head_dim: int, itemsize: int) -> int:
    """sglang MHATokenToKVPoolHost.get_size_per_token: K and V, every layer."""
    return head_dim * kv_heads * layers * itemsize * 2


def mla_bytes_per_token(
    layers: int, kv_lora_rank: int, qk_rope_head_dim: int, itemsize: int
) -> int:
    """sglang MLATokenToKVPoolHost.get_size_per_token (no override, no indexer)."""
    return (kv_lora_rank + qk_rope_head_dim) * itemsize * layers


def kv_heads_per_rank(total_kv_heads: int, tp_size: int) -> int:
    """sglang's ``get_num_kv_heads(tp_size)``: KV heads are split across TP ranks, at least one."""
    _positive_int(total_kv_heads, "kv_heads")
    _positive_int(tp_size, "tp_size")
    return max(1, total_kv_heads // tp_size)


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
        raise SizingError(f"hicache_size: expected a number of GB, got {hicache_size!r}")
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
            raise SizingError(f"hicache_ratio: expected a number, got {hicache_ratio!r}")
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
        raise SizingError(f"budget_bytes: expected an integer, got {budget_bytes!r}")
    if budget_bytes <= 0:
        return None
    max_tokens_allowed = (budget_bytes // bytes_per_token // page_size) * page_size
    if max_tokens_allowed == 0:
        return None
    s = (max_tokens_allowed * bytes_per_token - 1) // 10**9
    return s if s >= 1 else None


# ---- the host-memory check -------------------------------------------------------------------


def host_memory_error(requested_bytes: int, available_bytes: int) -> str:
    """sglang's exact ValueError text (available is MemAvailable minus the 10 GiB reserve)."""
    return (
        f"Not enough host memory available. Requesting "
        f"{requested_bytes / 1e9:.2f} GB but only have "
        f"{available_bytes / 1e9:.2f} GB free. Please reduce the "
        f"size of the hierarchical cache."
    )


def parse_meminfo(text: str, source: str = "meminfo") -> dict[str, int]:
    """``/proc/meminfo`` as {field: value in the file's unit (kB for most, count for HugePages_*)}.

    A line that is not ``Name: number [kB]`` is an error naming ``source`` and the line number.
    """
    out: dict[str, int] = {}
    for t in meminfo_lines(text.splitlines()):
        parts = t.value.split()
        if (
            not t.has_colon
            or not t.key.strip()
            or not 1 <= len(parts) <= 2
            or not parts[0].isdigit()
        ):
            raise SizingError(f"{source}:{t.lineno}: cannot read meminfo line {t.raw!r}")
        out[t.key.strip()] = int(parts[0])
    return out


def read_meminfo(path: str | os.PathLike[str] = "/proc/meminfo") -> dict[str, int]:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError as e:
        raise SizingError(f"{os.fspath(path)}: cannot read meminfo ({e.strerror})") from None
    return parse_meminfo(text, os.fspath(path))


def _zoneinfo_watermark_low_pages(path: str | os.PathLike[str] | None) -> int | None:
    if path is None:
        return None
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return sum(
                int(parts[1])
                for parts in (line.split() for line in f)
                if len(parts) >= 2 and parts[0] == "low" and parts[1].isdigit()
            )
    except OSError:
        return None


def host_available_bytes(
    meminfo: Mapping[str, int] | str | os.PathLike[str] = "/proc/meminfo",
    *,
    zoneinfo: str | os.PathLike[str] | None = None,
    page_size: int = 4096,
    watermark_low_pages: int | None = None,
) -> int:
    """What sglang reads as free host memory: ``psutil.virtual_memory().available`` on Linux.

    That is MemAvailable (kB * 1024). Like psutil: when MemAvailable is absent (kernel < 3.14)
    or 0 it is estimated from MemFree, the file LRU, SReclaimable and the zones' low watermarks
    (``zoneinfo``; without it, MemFree + Cached); a negative result is 0 and one above MemTotal
    is MemFree. ``meminfo`` is a dict from parse_meminfo or a path to a meminfo file. Note that
    a reserved hugetlb pool is not in MemAvailable: this is the check's blind spot.
    """
    if isinstance(meminfo, Mapping):
        mems = dict(meminfo)
    else:
        if zoneinfo is None:
            zoneinfo = os.path.join(os.path.dirname(os.fspath(meminfo)), "zoneinfo")
        mems = read_meminfo(meminfo)
    for needed in ("MemTotal", "MemFree"):
        if needed not in mems:
            raise SizingError(f"meminfo: {needed} missing")

    def kb(name: str, default: int = 0) -> int:
        return mems.get(name, default) * 1024

    total, free = kb("MemTotal"), kb("MemFree")
    avail = kb("MemAvailable")
    if avail == 0:
        avail = free + kb("Cached")
        lru = ("Active(file)", "Inactive(file)", "SReclaimable")
        low_pages = (
            watermark_low_pages
            if watermark_low_pages is not None
            else _zoneinfo_watermark_low_pages(zoneinfo)
        )
        if all(k in mems for k in lru) and low_pages is not None:
            low = low_pages * page_size
            pagecache = kb("Active(file)") + kb("Inactive(file)")
            sreclaim = kb("SReclaimable")
            # psutil's float arithmetic, kept as is so the result matches it.
            est: float = free - low
            est += pagecache - min(pagecache / 2, low)
            est += sreclaim - min(sreclaim / 2.0, low)
            avail = int(est)
    if avail < 0:
        return 0
    if avail > total:
        return free
    return avail


def hugetlb_pool_bytes(meminfo: Mapping[str, int]) -> int:
    """Bytes reserved in the default-size hugetlb pool (HugePages_Total * Hugepagesize).

    None of it is in MemAvailable, so sglang's host check cannot see it even when it is free.
    """
    return mem_field(meminfo, "HugePages_Total", 0) * mem_field(meminfo, "Hugepagesize", 0) * 1024


def mem_field(meminfo: Mapping[str, int], name: str, default: int | None = None) -> int:
    """One meminfo field (in the file's unit); a missing one is ``default`` or an error."""
    if name in meminfo:
        return meminfo[name]
    if default is None:
        raise SizingError(f"meminfo: {name} missing")
    return default


def host_memory_budget(
    meminfo: Mapping[str, int] | str | os.PathLike[str] = "/proc/meminfo",
    *,
    zoneinfo: str | os.PathLike[str] | None = None,
    watermark_low_pages: int | None = None,
) -> int:
    """``available - 10 GiB``: the most a HiCache host pool may request (can be negative).

    ``watermark_low_pages``: Σ low watermarks of /proc/zoneinfo, for a meminfo without
    MemAvailable (instead of reading ``zoneinfo``).
    """
    available = host_available_bytes(
        meminfo, zoneinfo=zoneinfo, watermark_low_pages=watermark_low_pages
    )
    return available - HICACHE_HOST_MEMORY_RESERVE_BYTES


def check_host_memory(requested_bytes: int, available_bytes: int) -> None:
    """Raise sglang's ValueError when ``requested_bytes`` exceeds the budget.

    ``available_bytes`` is the budget (MemAvailable - 10 GiB), as in sglang's message.
    """
    if requested_bytes > available_bytes:
        raise ValueError(host_memory_error(requested_bytes, available_bytes))


def check_request(
    request: HicacheRequest, meminfo: Mapping[str, int] | str | os.PathLike[str]
) -> None:
    """sglang's check for one rank's request against a host's meminfo."""
    check_host_memory(request.nbytes, host_memory_budget(meminfo))
