"""A command told to end by SIGTERM ends even when Python ignores the exception its handler
raised (it can land in a weakref callback or a __del__): a watchdog ends it with 128 + the
signal once its grace is over (umbp_sim/external/procs.py ``ended_by_signals``)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

SWALLOWS = """
import sys, time
import umbp_sim.external.procs as procs
from umbp_sim.errors import Terminated
procs._TERMINATED_GRACE = 0.5
with procs.ended_by_signals():
    said = False
    while True:
        try:
            # Inside the try: the signal can land while print is still returning.
            if not said:
                print("ready", flush=True)
                said = True
            time.sleep(0.05)
        except Terminated:
            pass  # what Python does with it inside a weakref callback
"""


def test_a_swallowed_sigterm_still_ends_the_command() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-P", "-c", SWALLOWS], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        assert time.monotonic() - started >= 0.5  # not before the grace: finally blocks first
    finally:
        proc.kill()
        proc.wait()
