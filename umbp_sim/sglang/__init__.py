"""sglang's use of the UMBP allocator: HiCache host-pool sizing, env parsing, tensor allocator.

Importing this package does not import torch; only constructing the tensor allocator needs it.
"""

from typing import TYPE_CHECKING, Any

from umbp_sim.vocabulary import _lazy

# What the package offers, by the module that holds it: imported on first use (PEP 562), so
# importing one submodule (a parser's flags, a constant) does not load every other one. The
# imports below are the one list (umbp_sim/vocabulary/_lazy.py reads them for __getattr__; mypy
# types them).
if TYPE_CHECKING:
    from umbp_sim.sglang.env import (
        EnvVarError as EnvVarError,
        HostAllocEnv as HostAllocEnv,
        SglangEnvFailure as SglangEnvFailure,
        parse_env as parse_env,
        sglang_env_failure as sglang_env_failure,
        sglang_parse_env as sglang_parse_env,
    )
    from umbp_sim.sglang.sizing import (
        HICACHE_HOST_MEMORY_RESERVE_BYTES as HICACHE_HOST_MEMORY_RESERVE_BYTES,
        BufferSpec as BufferSpec,
        HicacheRequest as HicacheRequest,
        MHAModel as MHAModel,
        MLAModel as MLAModel,
        SizingError as SizingError,
        check_host_memory as check_host_memory,
        check_request as check_request,
        hicache_request as hicache_request,
        host_available_bytes as host_available_bytes,
        host_memory_budget as host_memory_budget,
        host_memory_error as host_memory_error,
        host_pool_tokens as host_pool_tokens,
        hugetlb_pool_bytes as hugetlb_pool_bytes,
        kv_heads_per_rank as kv_heads_per_rank,
        largest_hicache_size_that_fits as largest_hicache_size_that_fits,
        parse_meminfo as parse_meminfo,
        read_meminfo as read_meminfo,
    )
    from umbp_sim.sglang.startup import (
        HostPoolStartup as HostPoolStartup,
        start_host_pool as start_host_pool,
    )
    from umbp_sim.sglang.tensor_allocator import (
        DEMOTION_WARNING as DEMOTION_WARNING,
        LOGGER_NAME as LOGGER_NAME,
        TorchMissingError as TorchMissingError,
        UMBPHostTensorAllocator as UMBPHostTensorAllocator,
        alloc_failure_message as alloc_failure_message,
    )


def __getattr__(name: str) -> Any:
    return _lazy.attribute(__name__, name)
