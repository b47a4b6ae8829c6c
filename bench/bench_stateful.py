"""Steps per second of the stateful exploration (umbp_sim.explore.stateful). A benchmark,
not a test: prints the rate and its ratio to the 500 steps/s target.

    python bench/bench_stateful.py [--quick] [--json] [examples] [steps_per_example]
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from umbp_sim.explore import hypothesis_profiles as profiles
from umbp_sim.explore.stateful import AllocatorStateMachine

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, figure  # noqa: E402

TARGET = 500.0


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    nums = [int(a) for a in argv if a.isdigit()]
    examples = nums[0] if nums else (20 if "--quick" in argv else 100)
    steps = nums[1] if len(nums) > 1 else 50
    # The allocator's warnings (demotions, double frees...) are expected here.
    logging.getLogger("umbp_sim.allocator").setLevel(logging.ERROR)
    AllocatorStateMachine.steps_run = 0
    t0 = time.perf_counter()
    run_state_machine_as_test(
        AllocatorStateMachine,
        settings=settings(
            profiles.active(), max_examples=examples, stateful_step_count=steps, database=None
        ),
    )
    dt = time.perf_counter() - t0
    n = AllocatorStateMachine.steps_run
    rate = n / dt
    return {
        "bench": "stateful",
        "examples": examples,
        "steps": n,
        "seconds": dt,
        "figures": [
            figure(
                f"stateful test steps/s ({examples} schedules, {n} steps)",
                [rate],
                unit="1/s",
                target=f">= {TARGET:.0f}",
                higher_is_better=True,
            ),
        ],  # fmt: skip
    }


if __name__ == "__main__":
    emit(main(), sys.argv[1:])
