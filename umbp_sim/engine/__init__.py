"""The run engine: every allocation runs here. A ``Run`` (host, fault plan, allocator, work,
environment, admin writes, counters) goes in, a ``RunRecord`` comes out, whether the allocator
is built in (in this process) or an external build (in a forked child of its server).

    record = engine.run(Run(machine, Alloc(AllocRequest(4 << 20, "AnonymousHugetlb"))))
    record.outcome   # "ok" | "demoted" | "failed" | "crashed" | "timeout" | "could-not-run"

``spec.py``: what a run is; ``record.py``: what came of it (the outcome vocabulary);
``execute.py``: the one function that performs a run on an allocator under test
(``subject.py``) with the work of ``work.py``; ``dispatch.py``: in process or to the server.
The names below load on first use (``umbp_sim._lazy``): the external side imports the record
without the dispatch that leads back to it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from umbp_sim import _lazy

# What the package offers, by the module that holds it: the one list (umbp_sim/_lazy.py reads
# these imports for __getattr__ and __all__; mypy types them).
if TYPE_CHECKING:
    from umbp_sim.engine.dispatch import open_allocator as open_allocator, run as run
    from umbp_sim.engine.record import OUTCOMES as OUTCOMES, RunRecord as RunRecord
    from umbp_sim.engine.spec import (
        Alloc as Alloc,
        Measure as Measure,
        Run as Run,
        RunError as RunError,
        SglangStartup as SglangStartup,
        Steps as Steps,
    )


def __getattr__(name: str) -> Any:
    return _lazy.attribute(__name__, name)
