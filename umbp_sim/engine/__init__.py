"""The run engine: every allocation runs here. A ``Run`` (host, fault plan, allocator, work,
environment, admin writes, counters) goes in, a ``RunRecord`` comes out, whether the allocator
is built in (in this process) or an external build (in a forked child of its server).

    record = run_router.run(Run(machine, Alloc(AllocRequest(4 << 20, "AnonymousHugetlb"))))
    record.outcome   # "ok" | "demoted" | "failed" | "crashed" | "timeout" | "could-not-run"

``spec.py``: what a run is; ``record.py``: what came of it (the outcome vocabulary);
``execute.py``: the one function that performs a run on an allocator under test
(``subject.py``) with the work of ``work.py``. Which allocator a run goes to, in process or to
an external build's server, is ``umbp_sim.run_router``'s, above the engine: nothing here
imports it or ``umbp_sim.external`` (tests/test_layers.py). The names below load on first use
(``umbp_sim.vocabulary._lazy``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from umbp_sim.vocabulary import _lazy

# What the package offers, by the module that holds it: the one list (umbp_sim/vocabulary/_lazy.py
# reads these imports for __getattr__ and __all__; mypy types them).
if TYPE_CHECKING:
    from umbp_sim.engine.record import OUTCOMES as OUTCOMES, RunRecord as RunRecord
    from umbp_sim.engine.spec import (
        Alloc as Alloc,
        Measure as Measure,
        Run as Run,
        RunError as RunError,
        SglangStartup as SglangStartup,
        Steps as Steps,
    )


# Deprecated aliases of the router's names, from when it lived here (engine/dispatch.py).
_MOVED = ("run", "open_allocator")


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        import warnings

        from umbp_sim import run_router

        warnings.warn(
            f"umbp_sim.engine.{name} is deprecated: use umbp_sim.run_router.{name}",
            DeprecationWarning,
            2,
        )
        return getattr(run_router, name)
    return _lazy.attribute(__name__, name)
