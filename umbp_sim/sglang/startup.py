"""One rank's HiCache host-pool startup, in sglang's order, reported instead of raised.

sglang's ``HostKVCache.__init__`` with ``--hicache-storage-backend mori``:

1. ``get_allocator_from_storage("mori")`` constructs ``UMBPHostTensorAllocator``: an ImportError
   or RuntimeError falls back to the torch allocator (with a warning); any other exception (the
   ``int()`` ValueError of a bad ``SGLANG_HICACHE_HOST_*`` value) kills the server;
2. sizing, then the host-memory check against MemAvailable - 10 GiB (ValueError);
3. ``init_kv_buffer``: one ``allocate()`` per buffer (three for MLA ``page_first_kv_split``
   with an indexer); a null handle is a RuntimeError that kills the server.

:func:`start_host_pool` runs these steps against a meminfo (a dump's, or the live one) and the
mori-compatible module (umbp-sim's by default, on whatever kernel is current) and returns what
the user would have seen.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from umbp_sim.errors import SimulatedCrash
from umbp_sim.sglang.env import sglang_env_failure
from umbp_sim.sglang.release import EMULATED, tensor_allocator
from umbp_sim.sglang.sizing import HicacheRequest, host_memory_budget, host_memory_error
from umbp_sim.sglang.tensor_allocator import (
    LOGGER_NAME,
    TorchMissingError,
    UMBPHostTensorAllocator,
    _default_module,
)
from umbp_sim.vocabulary.log_capture import LogCapture

# The allocator's own warnings (umbp-sim's, as mori logs them) and sglang's wrapper's.
WARNING_LOGGERS = ("umbp_sim.allocator", "umbp_sim.sglang", LOGGER_NAME)

FALLBACK_WARNING = (
    "UMBPHostTensorAllocator unavailable ({exc}). Falling back to torch.empty-based allocator."
)


@dataclass
class HostPoolStartup:
    """What one rank's startup came to.

    ``outcome``: "ok", "demoted" (allocated, but on 4 KiB pages when hugepages were asked),
    "fallback" (the UMBP allocator was unavailable; sglang uses torch.empty), "failed" (the
    server dies with ``error``), "crashed" (a simulated signal, ``signal``). ``stage`` is where
    it ended: "allocator", "host_check", "allocate" or "done". ``error`` is
    ``"<Type>: <message>"`` as the traceback's last line shows it.
    """

    outcome: str
    stage: str
    request: HicacheRequest
    error: str | None = None
    signal: str | None = None
    crash_node: int | None = None  # the node a simulated crash faulted on, when known
    warnings: list[str] = field(default_factory=list)
    handles: list[Any] = field(default_factory=list)
    allocator: UMBPHostTensorAllocator | None = None
    tensors: list[Any] = field(default_factory=list)

    def close(self) -> None:
        """Drop the tensors and free every buffer (``handles`` stay, as a record)."""
        self.tensors.clear()
        if self.allocator is not None:
            self.allocator.close()


def _torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name.removeprefix("torch."))


def start_host_pool(
    request: HicacheRequest,
    meminfo: Mapping[str, int] | str | os.PathLike[str],
    *,
    env: Mapping[str, str] | None = None,
    module: Any = None,
    keep: bool = False,
    release: str | None = None,
    watermark_low_pages: int | None = None,
) -> HostPoolStartup:
    """Run sglang's startup steps for ``request``; ``keep`` keeps the buffers (else freed).

    ``env`` defaults to ``os.environ``; ``module`` to umbp-sim's mori-compatible module;
    ``release`` names whose UMBPHostTensorAllocator runs (``umbp_sim.sglang.release``; default:
    umbp-sim's emulation of the newest release).
    """
    env = dict(os.environ if env is None else env)
    result = HostPoolStartup(outcome="ok", stage="allocator", request=request)
    failure = sglang_env_failure(env)
    if failure is not None:
        result.outcome, result.error = "failed", failure.error
        return result

    collect = LogCapture()
    logs = [logging.getLogger(name) for name in WARNING_LOGGERS]
    for log in logs:
        log.addHandler(collect)
    try:
        try:
            if release in (None, *EMULATED):
                allocator = UMBPHostTensorAllocator(env, module=module)
            else:
                allocator = tensor_allocator(release, env, module or _default_module())
        except TorchMissingError:
            # Not sglang's situation (sglang always has torch): this simulation cannot run.
            raise
        except (ImportError, RuntimeError) as e:
            result.outcome = "fallback"
            collect.messages.append(FALLBACK_WARNING.format(exc=e))
            allocator = None
        result.allocator = allocator

        result.stage = "host_check"
        budget = host_memory_budget(meminfo, watermark_low_pages=watermark_low_pages)
        if request.nbytes > budget:
            result.outcome = "failed"
            result.error = f"ValueError: {host_memory_error(request.nbytes, budget)}"
            return result
        if allocator is None:
            result.stage = "done"
            return result

        result.stage = "allocate"
        dtype = _torch_dtype(request.model.dtype)
        for spec in request.buffers:
            try:
                result.tensors.append(allocator.allocate(spec.dims, dtype))
            except SimulatedCrash as e:
                result.outcome, result.signal, result.error = "crashed", e.signal, str(e)
                result.crash_node = e.node
                return result
            except RuntimeError as e:
                result.outcome, result.error = "failed", f"RuntimeError: {e}"
                return result
            except MemoryError as e:  # mori lets std::bad_alloc escape alloc: the server dies
                result.outcome, result.error = "failed", f"MemoryError: {e}"
                return result
        result.handles = list(allocator.owned_handles)
        result.stage = "done"
        if allocator.demotions:
            result.outcome = "demoted"
        return result
    finally:
        for log in logs:
            log.removeHandler(collect)
        result.warnings = collect.messages
        if not keep:
            result.close()
