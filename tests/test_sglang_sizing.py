"""HiCache host-pool sizing: sglang's formulas to the byte, and the two reported host checks."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, strategies as st

from umbp_sim.sglang import sizing
from umbp_sim.sglang.sizing import (
    HICACHE_HOST_MEMORY_RESERVE_BYTES,
    MHAModel,
    MLAModel,
    SizingError,
    check_host_memory,
    check_request,
    hicache_request,
    host_available_bytes,
    host_memory_budget,
    host_memory_error,
    host_pool_tokens,
    largest_hicache_size_that_fits,
    parse_meminfo,
)

GiB = 1 << 30
MiB2 = 2 << 20
LLAMA3_8B = MHAModel(layers=32, kv_heads=8, head_dim=128, dtype="bfloat16")
# DeepSeek-V3/R1 on one rank: 61 layers, kv_lora_rank 512, qk_rope_head_dim 64, bf16 KV.
DEEPSEEK_V3 = MLAModel(layers=61, kv_lora_rank=512, qk_rope_head_dim=64, dtype="bfloat16")


def meminfo_text(fields: dict[str, int]) -> str:
    return "".join(
        f"{k}:{v:>16}{'' if k.startswith('HugePages_') else ' kB'}\n" for k, v in fields.items()
    )


# ---- the worked example of docs/field-failures.md ------------------------------------------------


def test_worked_example_to_the_byte() -> None:
    r = hicache_request(LLAMA3_8B, hicache_size=100, page_size=64)
    assert r.bytes_per_token == 131072
    # 100e9 // 131072 = 762939 tokens; 762939 // 64 + 1 = 11921 pages; 11921 * 64 = 762944.
    assert r.page_num == 11921
    assert r.tokens == 762944
    assert r.nbytes == 100_000_595_968
    assert r.nbytes % MiB2 == 0 and r.nbytes // MiB2 == 47_684
    assert r.dims == ((2, 32, 762944, 8, 128),)
    assert r.allocated_bytes == r.nbytes


def test_one_extra_page_even_when_aligned() -> None:
    # 64 tokens exactly: sglang still adds a page (64 // 64 + 1 = 2 pages).
    assert host_pool_tokens(1, 64, hicache_ratio=1.0, device_pool_tokens=64) == (128, 2)
    assert host_pool_tokens(1, 64, hicache_ratio=1.0, device_pool_tokens=63) == (64, 1)
    assert host_pool_tokens(1, 1, hicache_ratio=2.0, device_pool_tokens=10) == (21, 21)
    # hicache_size 0 means "use the ratio"; a zero device pool still gets one page.
    assert host_pool_tokens(7, 16, hicache_size=0, device_pool_tokens=0) == (16, 1)


def test_ratio_uses_sglang_float_product() -> None:
    # int(device_pool.size * host_to_device_ratio), not round(): 3 * 0.1 = 0.30000000000000004
    assert host_pool_tokens(1, 1, hicache_ratio=0.1, device_pool_tokens=3) == (1, 1)
    assert host_pool_tokens(1, 1, hicache_ratio=1.5, device_pool_tokens=3) == (5, 5)


@pytest.mark.parametrize(
    ("layout", "dims"),
    [
        ("layer_first", (2, 32, 762944, 8, 128)),
        ("page_first", (2, 762944, 32, 8, 128)),
        ("page_first_direct", (2, 11921, 32, 64, 8, 128)),
        ("page_head", (2, 11921, 8, 64, 32, 128)),
    ],
)
def test_mha_dims_per_layout(layout: str, dims: tuple[int, ...]) -> None:
    r = hicache_request(LLAMA3_8B, hicache_size=100, page_size=64, layout=layout)
    assert r.dims == (dims,)
    assert r.buffers[0].nbytes == r.nbytes == 100_000_595_968


def test_mla_bytes_per_token_and_dims() -> None:
    assert DEEPSEEK_V3.bytes_per_token == (512 + 64) * 2 * 61 == 70272
    assert sizing.mla_bytes_per_token(61, 512, 64, 2) == 70272
    r = hicache_request(DEEPSEEK_V3, hicache_size=10, page_size=64)
    # 10e9 // 70272 = 142304; 142304 // 64 + 1 = 2224 pages -> 142336 tokens
    assert (r.tokens, r.page_num) == (142336, 2224)
    assert r.dims == ((61, 142336, 1, 576),)
    assert hicache_request(
        DEEPSEEK_V3, hicache_size=10, page_size=64, layout="page_first"
    ).dims == ((142336, 61, 1, 576),)
    assert hicache_request(
        DEEPSEEK_V3, hicache_size=10, page_size=64, layout="page_first_direct"
    ).dims == ((2224, 61, 64, 1, 576),)


def test_mla_page_first_kv_split_three_buffers() -> None:
    model = MLAModel(61, 512, 64, "bfloat16", index_head_dim=128)
    r = hicache_request(model, hicache_size=10, page_size=64, layout="page_first_kv_split")
    assert [b.name for b in r.buffers] == ["k_buffer", "v_buffer", "index_k_buffer"]
    assert r.dims == ((2224, 61, 64, 1, 512), (2224, 61, 64, 1, 64), (2224, 61, 64, 1, 128))
    # The check counts k + v only; the indexer buffer is allocated on top of it.
    assert r.nbytes == 142336 * 70272
    assert r.allocated_bytes == r.nbytes + 142336 * 61 * 128 * 2
    # Without an indexer: two buffers, exactly nbytes.
    r2 = hicache_request(DEEPSEEK_V3, hicache_size=10, page_size=64, layout="page_first_kv_split")
    assert [b.name for b in r2.buffers] == ["k_buffer", "v_buffer"]
    assert r2.allocated_bytes == r2.nbytes


def test_override_kv_cache_dim() -> None:
    m = MLAModel(61, 512, 64, "float8_e4m3fn", override_kv_cache_dim=656)
    assert m.bytes_per_token == 656 * 1 * 61


@pytest.mark.parametrize(
    ("model", "layout", "text"),
    [
        (LLAMA3_8B, "page_first_kv_split", "layout: Unsupported layout: page_first_kv_split"),
        (DEEPSEEK_V3, "page_head", "layout: Unsupported layout: page_head"),
        (LLAMA3_8B, "bogus", "layout: Unsupported layout: bogus"),
    ],
)
def test_unsupported_layout(model: sizing.Model, layout: str, text: str) -> None:
    with pytest.raises(SizingError, match=f"^{text} "):
        hicache_request(model, hicache_size=1, layout=layout)


@pytest.mark.parametrize(
    ("call", "text"),
    [
        (lambda: MHAModel(0, 8, 128), "layers: must be > 0, got 0"),
        (lambda: MHAModel(32, 8, 128, "int4"), "dtype: unknown dtype 'int4'"),
        (lambda: hicache_request(LLAMA3_8B), "device_pool_tokens: required"),
        (lambda: hicache_request(LLAMA3_8B, hicache_size=-1), "hicache_size: must be >= 0"),
        (lambda: hicache_request(LLAMA3_8B, hicache_size=1, page_size=0), "page_size: must be > 0"),
        (lambda: hicache_request(LLAMA3_8B, hicache_size="1"), "hicache_size: expected"),
    ],
)
def test_bad_input_names_the_argument(call, text: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SizingError) as ei:
        call()
    assert str(ei.value).startswith(text)


def test_kv_heads_per_rank() -> None:
    assert sizing.kv_heads_per_rank(8, 1) == 8
    assert sizing.kv_heads_per_rank(8, 8) == 1
    assert sizing.kv_heads_per_rank(8, 16) == 1  # replicated, never 0
    with pytest.raises(SizingError, match="^tp_size: must be > 0, got 0$"):
        sizing.kv_heads_per_rank(8, 0)


@pytest.mark.torch
def test_dtype_itemsize_accepts_torch_dtypes() -> None:
    import torch

    assert sizing.dtype_itemsize(torch.bfloat16) == 2
    assert sizing.dtype_itemsize("torch.float8_e4m3fn") == 1
    assert sizing.dtype_itemsize(torch.float32) == 4


# ---- the host check and the two reported figures ----


def test_host_memory_error_text() -> None:
    assert host_memory_error(7_054_819_328, 2_040_053_760) == (
        "Not enough host memory available. Requesting 7.05 GB but only have 2.04 GB free. "
        "Please reduce the size of the hierarchical cache."
    )
    with pytest.raises(ValueError) as ei:
        check_host_memory(2, 1)
    assert type(ei.value) is ValueError
    check_host_memory(5, 5)  # equal fits: sglang raises only on requested > available


# Report 1: HugePages_Free == HugePages_Total and
#   "Requesting 7.05 GB but only have 2.04 GB free".
# Derivation. Requested: X in [7.045e9, 7.055e9). Llama-3.1-8B (32 layers, 8 KV heads,
# head_dim 128, bf16) is 131072 B/token, so tokens in [53750, 53826). An integer
# --hicache-size cannot land there (7 GB gives 53440 tokens = 7.00 GB; the page rounding adds at
# most 64 tokens = 8 MiB), so the pool came from --hicache-ratio: the default ratio 2.0 on a
# device pool of 26880 tokens (420 pages of 64) gives int(26880 * 2.0) = 53760,
# 53760 // 64 + 1 = 841 pages = 53824 tokens = 7,054,819,328 B -> "7.05".
# Free: Y = MemAvailable - 10 GiB in [2.035e9, 2.045e9), so MemAvailable in
# [12,473,065 kB, 12,482,830 kB); we take 12,478,000 kB -> 2,040,053,760 B -> "2.04".
# The host reserved 8192 x 2 MiB pages (16 GiB, all free), which MemAvailable does not count:
# the 7.05 GB would have fit in the pool twice over. Without the reservation MemAvailable is
# 12,478,000 + 16,777,216 kB and the check passes (then the hugetlb request is demoted).
REPORT1_MEMINFO = {
    "MemTotal": 32_598_112,
    "MemFree": 11_020_500,
    "MemAvailable": 12_478_000,
    "Buffers": 120_000,
    "Cached": 1_900_000,
    "HugePages_Total": 8192,
    "HugePages_Free": 8192,
    "HugePages_Rsvd": 0,
    "HugePages_Surp": 0,
    "Hugepagesize": 2048,
    "Hugetlb": 16_777_216,
}


def test_report1_figures() -> None:
    r = hicache_request(LLAMA3_8B, hicache_ratio=2.0, device_pool_tokens=26880, page_size=64)
    assert (r.tokens, r.nbytes) == (53824, 7_054_819_328)
    assert host_available_bytes(REPORT1_MEMINFO) == 12_478_000 * 1024
    assert host_memory_budget(REPORT1_MEMINFO) == 2_040_053_760
    with pytest.raises(ValueError) as ei:
        check_request(r, REPORT1_MEMINFO)
    assert str(ei.value) == (
        "Not enough host memory available. Requesting 7.05 GB but only have 2.04 GB free. "
        "Please reduce the size of the hierarchical cache."
    )
    # The request fits in the free hugetlb pool the check cannot see.
    assert r.nbytes <= REPORT1_MEMINFO["HugePages_Free"] * MiB2
    # Without the reservation the same request passes the check.
    unreserved = dict(REPORT1_MEMINFO, HugePages_Total=0, HugePages_Free=0, Hugetlb=0)
    unreserved["MemAvailable"] += 16_777_216
    unreserved["MemFree"] += 16_777_216
    check_request(r, unreserved)


# Report 2: 8-GPU host, 1772 GiB RAM of which 1582 GiB reserved as 2 MiB pages:
#   "Requesting 176.71 GB but only have 105.82 GB free".
# Derivation. Free: MemAvailable - 10 GiB in [105.815e9, 105.825e9) -> MemAvailable in
# [113,820,721 kB, 113,830,487 kB); we take 113,825,000 kB -> 105,819,381,760 B -> "105.82".
# That is 108.6 GiB of the 190 GiB left outside the 809,984-page (1582 GiB) pool.
# Requested: X in [176.705e9, 176.715e9) per rank. DeepSeek-V3/R1 MLA, bf16 KV, one rank:
# (512 + 64) * 2 * 61 = 70,272 B/token -> tokens in [2,514,587, 2,514,729); with page 64 the
# multiples there are 2,514,624 and 2,514,688. Again not an integer --hicache-size (176 GB
# -> 176.00), so the default ratio 2.0 on a device pool of 1,257,280 tokens (19,645 pages,
# 88.4 GB of KV per MI300X-class GPU): int(1,257,280 * 2.0) // 64 + 1 = 39,291 pages
# = 2,514,624 tokens = 176,707,657,728 B -> "176.71" (84,261 pages of 2 MiB per rank).
# All 8 ranks together need 674,088 pages: the reserved 809,984 would have held them.
REPORT2_MEMINFO = {
    "MemTotal": 1772 * GiB // 1024,
    "MemFree": 110_000_000,
    "MemAvailable": 113_825_000,
    "Cached": 4_000_000,
    "HugePages_Total": 809_984,
    "HugePages_Free": 809_984,
    "HugePages_Rsvd": 0,
    "HugePages_Surp": 0,
    "Hugepagesize": 2048,
    "Hugetlb": 1582 * GiB // 1024,
}


def test_report2_figures() -> None:
    assert sizing.hugetlb_pool_bytes(REPORT2_MEMINFO) == 1582 * GiB
    assert sizing.hugetlb_pool_bytes(REPORT1_MEMINFO) == 16 * GiB
    assert sizing.hugetlb_pool_bytes({"MemTotal": 1}) == 0
    r = hicache_request(DEEPSEEK_V3, hicache_ratio=2.0, device_pool_tokens=1_257_280, page_size=64)
    assert (r.bytes_per_token, r.tokens, r.nbytes) == (70272, 2_514_624, 176_707_657_728)
    assert host_memory_budget(REPORT2_MEMINFO) == 105_819_381_760
    with pytest.raises(ValueError) as ei:
        check_request(r, REPORT2_MEMINFO)
    assert str(ei.value) == (
        "Not enough host memory available. Requesting 176.71 GB but only have 105.82 GB free. "
        "Please reduce the size of the hierarchical cache."
    )
    pages_per_rank = -(-r.nbytes // MiB2)
    assert pages_per_rank == 84_261
    assert 8 * pages_per_rank == 674_088 <= REPORT2_MEMINFO["HugePages_Free"]
    unreserved = dict(REPORT2_MEMINFO, HugePages_Total=0, HugePages_Free=0, Hugetlb=0)
    unreserved["MemAvailable"] += 1582 * GiB // 1024
    check_request(r, unreserved)


# ---- MemAvailable as psutil reads it ----


def test_meminfo_file_and_zoneinfo_fallback(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "meminfo"
    p.write_text(meminfo_text(REPORT2_MEMINFO))
    assert parse_meminfo(p.read_text())["HugePages_Total"] == 809_984
    assert host_available_bytes(str(p)) == 113_825_000 * 1024
    assert host_memory_budget(p) == 105_819_381_760
    # No MemAvailable (kernel < 3.14): psutil's estimate from the zones' low watermarks.
    old = {
        "MemTotal": 1_000_000,
        "MemFree": 400_000,
        "Cached": 50_000,
        "Active(file)": 100_000,
        "Inactive(file)": 60_000,
        "SReclaimable": 30_000,
    }
    p.write_text(meminfo_text(old))
    (tmp_path / "zoneinfo").write_text(
        "Node 0, zone Normal\n  pages free 5\n        low      1000\n"
    )
    low = 1000 * 4096
    expect = int(
        400_000 * 1024
        - low
        + (160_000 * 1024 - min(160_000 * 1024 / 2, low))
        + (30_000 * 1024 - min(30_000 * 1024 / 2.0, low))
    )
    assert host_available_bytes(p) == expect
    (tmp_path / "zoneinfo").unlink()
    assert host_available_bytes(p) == (400_000 + 50_000) * 1024  # MemFree + Cached
    # MemAvailable above MemTotal (a container's view): psutil falls back to MemFree.
    assert host_available_bytes({"MemTotal": 10, "MemFree": 3, "MemAvailable": 11}) == 3 * 1024


def test_meminfo_errors(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SizingError, match=r"^meminfo:2: cannot read meminfo line 'garbage'$"):
        parse_meminfo("MemTotal: 5 kB\ngarbage\n")
    with pytest.raises(SizingError, match=r"nope: cannot read meminfo"):
        sizing.read_meminfo(tmp_path / "nope")
    with pytest.raises(SizingError, match=r"^meminfo: MemFree missing$"):
        host_available_bytes({"MemTotal": 5})


def test_live_meminfo_reads() -> None:
    assert host_available_bytes() > 0  # the default path: this host's /proc/meminfo
    # One snapshot for both: memory moves between two reads on a busy host.
    snapshot = sizing.read_meminfo()
    assert snapshot["MemTotal"] > 0
    assert host_memory_budget(snapshot) == (
        host_available_bytes(snapshot) - HICACHE_HOST_MEMORY_RESERVE_BYTES
    )


# ---- largest_hicache_size_that_fits ----


def sglang_nbytes(size_gb: int, bpt: int, ps: int) -> int:
    """sglang's own expressions, float and all."""
    tokens = int(size_gb * 1e9 // bpt)
    return (tokens // ps + 1) * ps * bpt


def test_largest_fits_examples() -> None:
    # The worked example: 100 GB needs 100,000,595,968 B; that budget allows 100, one byte less 99.
    assert largest_hicache_size_that_fits(131072, 64, 100_000_595_968) == 100
    assert largest_hicache_size_that_fits(131072, 64, 100_000_595_967) == 99
    # Report 2's budget on DeepSeek-V3 with page 64.
    s = largest_hicache_size_that_fits(70272, 64, 105_819_381_760)
    assert s == 105
    assert sglang_nbytes(105, 70272, 64) <= 105_819_381_760 < sglang_nbytes(106, 70272, 64)
    assert largest_hicache_size_that_fits(131072, 64, 0) is None
    assert largest_hicache_size_that_fits(131072, 64, -5) is None
    assert largest_hicache_size_that_fits(131072, 64, 1_000_000_000) is None  # 1 GB + a page


@given(
    bpt=st.integers(1, 1 << 22),
    ps=st.sampled_from([1, 16, 32, 64, 128, 256, 1024]),
    budget=st.integers(-(1 << 20), 1 << 44),
)
def test_largest_fits_is_exact(bpt: int, ps: int, budget: int) -> None:
    s = largest_hicache_size_that_fits(bpt, ps, budget)
    if s is None:
        assert budget < sglang_nbytes(1, bpt, ps)
    else:
        assert s >= 1
        assert sglang_nbytes(s, bpt, ps) <= budget
        assert sglang_nbytes(s + 1, bpt, ps) > budget
        assert host_pool_tokens(bpt, ps, hicache_size=s)[0] * bpt == sglang_nbytes(s, bpt, ps)


@given(size=st.integers(1, 9_000_000), bpt=st.integers(1, 1 << 24), ps=st.integers(1, 4096))
def test_float_expression_equals_integer_arithmetic(size: int, bpt: int, ps: int) -> None:
    tokens, page_num = host_pool_tokens(bpt, ps, hicache_size=size)
    assert tokens == (size * 10**9 // bpt // ps + 1) * ps
    assert page_num == tokens // ps


def test_sizing_does_not_import_torch() -> None:
    code = (
        "import sys, umbp_sim.sglang.sizing, umbp_sim.sglang.env, umbp_sim.sglang; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
