"""The KV cache's model shapes as sglang's host pools size them: dtypes, MHA and MLA models and
their bytes per token, KV heads per tensor-parallel rank; ``SizingError`` for bad input.
``umbp_sim.sglang.sizing`` re-exports them. Must not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from umbp_sim.vocabulary.bounded import shown

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
        raise SizingError(f"dtype: unknown dtype {shown(dtype)} (known: {known})")
    return DTYPE_ITEMSIZE[name]


def _positive_int(value: object, what: str, *, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SizingError(f"{what}: expected an integer, got {shown(value)}")
    if value < 0 or (value == 0 and not allow_zero):
        raise SizingError(f"{what}: must be {'>= 0' if allow_zero else '> 0'}, got {value}")
    return value


class _KVShape:
    """What both models check and read alike: their dimensions (``_DIMS`` positive integers,
    ``_OPTIONAL_DIMS`` too when given, in that order) and the dtype's itemsize."""

    _DIMS: ClassVar[tuple[str, ...]]
    _OPTIONAL_DIMS: ClassVar[tuple[str, ...]] = ()
    dtype: str

    def __post_init__(self) -> None:
        for name in self._DIMS:
            _positive_int(getattr(self, name), name)
        for name in self._OPTIONAL_DIMS:
            if getattr(self, name) is not None:
                _positive_int(getattr(self, name), name)
        dtype_itemsize(self.dtype)

    @property
    def itemsize(self) -> int:
        return dtype_itemsize(self.dtype)


@dataclass(frozen=True)
class MHAModel(_KVShape):
    """What an MHA host pool needs per rank: kv_heads is the heads this rank holds."""

    kind: ClassVar[str] = "mha"
    _DIMS = ("layers", "kv_heads", "head_dim")

    layers: int
    kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"

    @property
    def bytes_per_token(self) -> int:
        return mha_bytes_per_token(self.layers, self.kv_heads, self.head_dim, self.itemsize)


@dataclass(frozen=True)
class MLAModel(_KVShape):
    """What an MLA host pool needs per rank (DeepSeek: kv_lora_rank 512, qk_rope_head_dim 64).

    ``index_head_dim`` is the DSA indexer's K width (DeepSeek V3.2: 128): only the
    ``page_first_kv_split`` layout allocates it, as a third buffer, and sglang's size per token
    (hence the host check) does not count it.
    """

    kind: ClassVar[str] = "mla"
    _DIMS = ("layers", "kv_lora_rank", "qk_rope_head_dim")
    _OPTIONAL_DIMS = ("index_head_dim", "override_kv_cache_dim")

    layers: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    dtype: str = "bfloat16"
    index_head_dim: int | None = None
    override_kv_cache_dim: int | None = None

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
