"""sglang's use of the UMBP allocator: HiCache host-pool sizing, env parsing, tensor allocator.

Importing this package does not import torch; only constructing the tensor allocator needs it.
"""

from typing import Any

from umbp_sim import _lazy

# What the package offers, by the module that holds it: imported on first use (PEP 562), so
# importing one submodule (a parser's flags, a constant) does not load every other one.
_EXPORTS = {
    "EnvVarError": "env",
    "HostAllocEnv": "env",
    "SglangEnvFailure": "env",
    "parse_env": "env",
    "sglang_env_failure": "env",
    "sglang_parse_env": "env",
    "HICACHE_HOST_MEMORY_RESERVE_BYTES": "sizing",
    "BufferSpec": "sizing",
    "HicacheRequest": "sizing",
    "MHAModel": "sizing",
    "MLAModel": "sizing",
    "SizingError": "sizing",
    "check_host_memory": "sizing",
    "check_request": "sizing",
    "hicache_request": "sizing",
    "host_available_bytes": "sizing",
    "host_memory_budget": "sizing",
    "host_memory_error": "sizing",
    "host_pool_tokens": "sizing",
    "hugetlb_pool_bytes": "sizing",
    "kv_heads_per_rank": "sizing",
    "largest_hicache_size_that_fits": "sizing",
    "parse_meminfo": "sizing",
    "read_meminfo": "sizing",
    "HostPoolStartup": "startup",
    "start_host_pool": "startup",
    "DEMOTION_WARNING": "tensor_allocator",
    "LOGGER_NAME": "tensor_allocator",
    "TorchMissingError": "tensor_allocator",
    "UMBPHostTensorAllocator": "tensor_allocator",
    "alloc_failure_message": "tensor_allocator",
}


def __getattr__(name: str) -> Any:
    return _lazy.attribute(__name__, _EXPORTS, name)


__all__ = [*_EXPORTS]
