"""sglang's use of the UMBP allocator: HiCache host-pool sizing, env parsing, tensor allocator.

Importing this package does not import torch; only constructing the tensor allocator needs it.
"""

from typing import Any

from umbp_sim import _lazy

# What the package offers, by the module that holds it: imported on first use (PEP 562), so
# importing one submodule (a parser's flags, a constant) does not load every other one.
_EXPORTS = _lazy.exports(
    env="EnvVarError HostAllocEnv SglangEnvFailure parse_env sglang_env_failure sglang_parse_env",
    sizing=(
        "HICACHE_HOST_MEMORY_RESERVE_BYTES BufferSpec HicacheRequest MHAModel MLAModel "
        "SizingError check_host_memory check_request hicache_request host_available_bytes "
        "host_memory_budget host_memory_error host_pool_tokens hugetlb_pool_bytes "
        "kv_heads_per_rank largest_hicache_size_that_fits parse_meminfo read_meminfo"
    ),
    startup="HostPoolStartup start_host_pool",
    tensor_allocator=(
        "DEMOTION_WARNING LOGGER_NAME TorchMissingError UMBPHostTensorAllocator "
        "alloc_failure_message"
    ),
)


def __getattr__(name: str) -> Any:
    return _lazy.attribute(__name__, _EXPORTS, name)


__all__ = [*_EXPORTS]
