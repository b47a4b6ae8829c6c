"""One ``replay --error`` builds a SimKernel per simulation it runs (the baseline, each fix the
search tries, the comparison with umbp-sim's fixed allocator, each hypothesis for a line not
reproduced) and no others: the questions that
size a fix (free pages, node memory) are asked of the state a run kept (``HostState``), never of
a kernel built to ask; the request goes from the command line to the engine as one typed
``Run``."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

import umbp_sim.diagnose.fix_search as fix_search
import umbp_sim.engine.execute as execute
from umbp_sim import _native, sim
from umbp_sim.cli import main

REPLAY = Path(__file__).parent / "data" / "replay"
LINE = (
    "RuntimeError: UMBPHostMemAllocator.alloc(4294967296 bytes) failed "
    "(requested_backing=UMBPHostBufferBacking.AnonymousHugetlb, numa_node=1)."
)


def test_replay_error_builds_one_kernel_per_simulation(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[int] = []
    runs: list[int] = []
    searched: list[int] = []

    class CountingKernel(_native.SimKernel):  # type: ignore[misc]
        def __init__(self, config: object) -> None:
            built.append(1)
            super().__init__(config)

    fresh_host, propose = execute.fresh_host, fix_search.propose

    def counting_fresh_host(machine: Any) -> Any:
        runs.append(1)
        return fresh_host(machine)

    def counting_propose(*args: Any, **kwargs: Any) -> Any:
        found = propose(*args, **kwargs)
        searched.append(found.runs)
        return found

    monkeypatch.setattr(_native, "SimKernel", CountingKernel)
    monkeypatch.setattr(execute, "fresh_host", counting_fresh_host)
    monkeypatch.setattr(fix_search, "propose", counting_propose)
    monkeypatch.setattr(sim, "_VIEWS", {})
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["replay", str(REPLAY / "pool-on-node0-6.8.0"), "--error", LINE, "--json"])
    doc = json.loads(out.getvalue())
    assert (code, doc["outcome"], doc["reproduces_error_line"]) == (0, "demoted", False)
    # The simulations: the baseline, every fix tried, the run under umbp-sim's allocator, and
    # each host state the line's hypotheses tried (the line is not reproduced: every one is
    # reported, kept or ruled out).
    hypotheses = doc["hypotheses"]["simulations"]
    assert searched and len(runs) == 1 + searched[0] + 1 + hypotheses
    # No other kernel: no host built only to be asked questions.
    assert len(built) == len(runs) == 51  # 1 + 41 fixes tried + 1 + 8 hypotheses tried
