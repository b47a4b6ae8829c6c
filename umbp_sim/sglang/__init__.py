"""sglang's use of the UMBP allocator: HiCache host-pool sizing, env parsing, tensor allocator.

Importing this package does not import torch; only constructing the tensor allocator needs it.
"""

from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:  # the same names for mypy (tests/test_cli_imports.py keeps them equal)
    from umbp_sim.sglang.env import (
        EnvVarError as EnvVarError,
    )
    from umbp_sim.sglang.env import (
        HostAllocEnv as HostAllocEnv,
    )
    from umbp_sim.sglang.env import (
        SglangEnvFailure as SglangEnvFailure,
    )
    from umbp_sim.sglang.env import (
        parse_env as parse_env,
    )
    from umbp_sim.sglang.env import (
        sglang_env_failure as sglang_env_failure,
    )
    from umbp_sim.sglang.env import (
        sglang_parse_env as sglang_parse_env,
    )
    from umbp_sim.sglang.sizing import (
        HICACHE_HOST_MEMORY_RESERVE_BYTES as HICACHE_HOST_MEMORY_RESERVE_BYTES,
    )
    from umbp_sim.sglang.sizing import (
        BufferSpec as BufferSpec,
    )
    from umbp_sim.sglang.sizing import (
        HicacheRequest as HicacheRequest,
    )
    from umbp_sim.sglang.sizing import (
        MHAModel as MHAModel,
    )
    from umbp_sim.sglang.sizing import (
        MLAModel as MLAModel,
    )
    from umbp_sim.sglang.sizing import (
        SizingError as SizingError,
    )
    from umbp_sim.sglang.sizing import (
        check_host_memory as check_host_memory,
    )
    from umbp_sim.sglang.sizing import (
        check_request as check_request,
    )
    from umbp_sim.sglang.sizing import (
        hicache_request as hicache_request,
    )
    from umbp_sim.sglang.sizing import (
        host_available_bytes as host_available_bytes,
    )
    from umbp_sim.sglang.sizing import (
        host_memory_budget as host_memory_budget,
    )
    from umbp_sim.sglang.sizing import (
        host_memory_error as host_memory_error,
    )
    from umbp_sim.sglang.sizing import (
        host_pool_tokens as host_pool_tokens,
    )
    from umbp_sim.sglang.sizing import (
        hugetlb_pool_bytes as hugetlb_pool_bytes,
    )
    from umbp_sim.sglang.sizing import (
        kv_heads_per_rank as kv_heads_per_rank,
    )
    from umbp_sim.sglang.sizing import (
        largest_hicache_size_that_fits as largest_hicache_size_that_fits,
    )
    from umbp_sim.sglang.sizing import (
        parse_meminfo as parse_meminfo,
    )
    from umbp_sim.sglang.sizing import (
        read_meminfo as read_meminfo,
    )
    from umbp_sim.sglang.startup import (
        HostPoolStartup as HostPoolStartup,
    )
    from umbp_sim.sglang.startup import (
        start_host_pool as start_host_pool,
    )
    from umbp_sim.sglang.tensor_allocator import (
        DEMOTION_WARNING as DEMOTION_WARNING,
    )
    from umbp_sim.sglang.tensor_allocator import (
        LOGGER_NAME as LOGGER_NAME,
    )
    from umbp_sim.sglang.tensor_allocator import (
        TorchMissingError as TorchMissingError,
    )
    from umbp_sim.sglang.tensor_allocator import (
        UMBPHostTensorAllocator as UMBPHostTensorAllocator,
    )
    from umbp_sim.sglang.tensor_allocator import (
        alloc_failure_message as alloc_failure_message,
    )


def __getattr__(name: str) -> Any:
    return _lazy.attribute(__name__, _EXPORTS, name)


__all__ = [*_EXPORTS]
