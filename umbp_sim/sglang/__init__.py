"""sglang's use of the UMBP allocator: HiCache host-pool sizing, env parsing, tensor allocator.

Importing this package does not import torch; only constructing the tensor allocator needs it.
"""

from umbp_sim.sglang.env import (
    EnvVarError,
    HostAllocEnv,
    SglangEnvFailure,
    parse_env,
    sglang_env_failure,
    sglang_parse_env,
)
from umbp_sim.sglang.sizing import (
    HICACHE_HOST_MEMORY_RESERVE_BYTES,
    BufferSpec,
    HicacheRequest,
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
    hugetlb_pool_bytes,
    kv_heads_per_rank,
    largest_hicache_size_that_fits,
    parse_meminfo,
    read_meminfo,
)
from umbp_sim.sglang.startup import HostPoolStartup, start_host_pool
from umbp_sim.sglang.tensor_allocator import (
    DEMOTION_WARNING,
    LOGGER_NAME,
    TorchMissingError,
    UMBPHostTensorAllocator,
    alloc_failure_message,
)

__all__ = [
    "DEMOTION_WARNING",
    "HICACHE_HOST_MEMORY_RESERVE_BYTES",
    "LOGGER_NAME",
    "BufferSpec",
    "EnvVarError",
    "HicacheRequest",
    "HostAllocEnv",
    "HostPoolStartup",
    "MHAModel",
    "MLAModel",
    "SglangEnvFailure",
    "SizingError",
    "TorchMissingError",
    "UMBPHostTensorAllocator",
    "alloc_failure_message",
    "check_host_memory",
    "check_request",
    "hicache_request",
    "host_available_bytes",
    "host_memory_budget",
    "host_memory_error",
    "host_pool_tokens",
    "hugetlb_pool_bytes",
    "kv_heads_per_rank",
    "largest_hicache_size_that_fits",
    "parse_env",
    "parse_meminfo",
    "read_meminfo",
    "sglang_env_failure",
    "sglang_parse_env",
    "start_host_pool",
]
