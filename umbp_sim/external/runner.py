"""Run an allocator over ``Run``s: the built-in one in process, an external one in a child.

``open_allocator(spec)`` gives an object with ``run(run) -> Outcome`` and ``close()``, the same
for every kind of SPEC. An external allocator lives in a server process
(``umbp_sim.external.child``) that forks once per run: each run is a fresh process, as in the
field, and its death by a real signal is reported, not suffered.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Protocol

from umbp_sim.allocator_spec import AllocatorSpec
from umbp_sim.errors import UmbpSimError
from umbp_sim.external.builtin import run_builtin
from umbp_sim.external.child import recv, send
from umbp_sim.external.outcome import (
    Outcome,
    Run,
    crash_report,
    trace_from_report,
    warning_lines,
)


class CouldNotRun(UmbpSimError):
    """The allocator could not be loaded or its server died (compare: exit 2)."""

    exit_code = 2


class AllocatorRunner(Protocol):
    spec: AllocatorSpec

    def run(self, run: Run) -> Outcome: ...

    def close(self) -> None: ...


class BuiltinRunner:
    """umbp-sim's own allocator, in this process, with a named policy profile."""

    def __init__(self, spec: AllocatorSpec) -> None:
        self.spec = spec
        self.mode = "builtin"

    def run(self, run: Run) -> Outcome:
        return run_builtin(run, profile=self.spec.name)

    def close(self) -> None:
        pass


class ExternalRunner:
    """An allocator build in a server process under the interposer; one fork per run."""

    def __init__(self, spec: AllocatorSpec, env: dict[str, str] | None = None) -> None:
        self.spec = spec
        payload = {"kind": spec.kind, "name": spec.name, "path": spec.path or ""}
        child_env = dict(os.environ)
        child_env.update(env or {})
        # The server's own stderr (the allocator's import) goes to a file: a pipe nobody reads
        # could fill up and stop it.
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "umbp_sim.external.child", json.dumps(payload)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=child_env,
        )
        try:
            hello = recv(self.proc.stdout)  # type: ignore[arg-type]
        except EOFError:
            self.proc.wait()
            self._stderr.seek(0)
            err = self._stderr.read().decode(errors="replace")
            self.close()
            last = err.strip().splitlines()[-1] if err.strip() else "no output"
            raise CouldNotRun(
                f"{spec}: the allocator's process exited before it was ready ({last})"
            ) from None
        if "error" in hello:
            self.close()
            raise CouldNotRun(f"{spec}: {hello['error']}")
        self.mode: str = hello["mode"]
        self.objects: list[str] = hello["objects"]

    def run(self, run: Run) -> Outcome:
        from umbp_sim.external.observe import ObserveJob

        # As a job of kind "run": its forked child runs ``run_job.run_in_child`` (the run's
        # environment, the buffer's NUMA binding).
        job = ObserveJob(machine=run.machine, kind="run", request={}, plan=run.plan, run=run)
        return outcome_from_reply(self.exchange(job))

    def observe(self, job: Any) -> dict[str, Any]:
        """A replay's ``ObserveJob`` in a forked child: the server's raw reply
        (``umbp_sim.external.observe.observed_from_reply`` reads it)."""
        return self.exchange(job)

    def exchange(self, message: Any) -> dict[str, Any]:
        try:
            send(self.proc.stdin, message)  # type: ignore[arg-type]
            reply: dict[str, Any] = recv(self.proc.stdout)  # type: ignore[arg-type]
        except (EOFError, BrokenPipeError) as e:
            raise CouldNotRun(f"{self.spec}: the allocator's server died ({e})") from None
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            if self.proc.stdin:
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdout, self.proc.stdin, self._stderr):
            if f and not f.closed:
                f.close()


def _signal_name(sig: int) -> str:
    import signal

    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def outcome_from_reply(reply: dict[str, Any]) -> Outcome:
    """An Outcome from what the server saw of one forked run."""
    log = reply["log"]
    res = reply["result"]
    stages = reply["stages"]
    warnings = warning_lines(log)
    if reply["signal"] is not None:
        sig_name, detail = crash_report(log)
        stage = stages[-1] if stages else "start"
        return Outcome(
            result="crash",
            crash={
                "signal": _signal_name(reply["signal"]),
                "stage": stage,
                "simulated": sig_name is not None,
                "detail": detail,
            },
            warnings=warnings,
            trace=trace_from_report(log),
        )
    if res is None:
        tail = log.strip().splitlines()[-1] if log.strip() else f"exit code {reply['code']}"
        return Outcome(result="could-not-run", error=tail, warnings=warnings)
    res = res["observed"]  # every job's result comes wrapped
    handle = res["handle"]
    if res["error"] and handle is None:
        result = "error"
    elif handle is not None and handle["valid"]:
        result = "ok"
    else:
        result = "invalid"
    return Outcome(
        result=result,
        handle=handle,
        error=res["error"],
        warnings=warnings,
        trace=res["trace"],
        leaks=res["leaks"],
        free_ok=res["free_ok"],
        binding=res.get("binding"),
    )


def open_allocator(spec: AllocatorSpec, env: dict[str, str] | None = None) -> AllocatorRunner:
    if spec.kind == "builtin":
        return BuiltinRunner(spec)
    return ExternalRunner(spec, env)
