"""Steps per second of the stateful exploration (umbp_sim.explore.stateful). A benchmark,
not a test: prints the rate and its ratio to the 500 steps/s target.

    python bench/bench_stateful.py [examples] [steps_per_example]
"""

from __future__ import annotations

import sys
import time

from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from umbp_sim.explore import profiles
from umbp_sim.explore.stateful import AllocatorStateMachine

TARGET = 500.0


def main() -> int:
    examples = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 50
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
    print(f"stateful: {examples} schedules, {n} steps in {dt:.2f} s: {rate:.0f} steps/s "
          f"({rate / TARGET:.2f}x the {TARGET:.0f} steps/s target)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
