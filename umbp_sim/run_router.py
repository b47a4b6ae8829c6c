"""Where a ``Run`` goes: ``run(run) -> RunRecord``, and compare's opened allocators.

A built-in profile runs in this process (``execute`` with ``BuiltinSubject``); an external
SPEC runs in a forked child of that allocator's server (``umbp_sim.external.observe.runner_for``:
one server per allocator and command), whose child calls the same ``execute``
(``umbp_sim.external.run_job``), and comes back as the server saw it
(``observe.record_from_reply``).

The router sits above both the engine and ``umbp_sim.external``: neither imports it
(tests/test_layers.py). ``umbp_sim.engine.run`` and ``open_allocator`` are deprecated aliases.
"""

from __future__ import annotations

from typing import Protocol

from umbp_sim.allocator_profiles import canonical_profile
from umbp_sim.allocator_spec import AllocatorSpec, is_external, parse_allocator_spec
from umbp_sim.engine.execute import execute
from umbp_sim.engine.measure import measure_in_child
from umbp_sim.engine.record import RunRecord
from umbp_sim.engine.spec import Measure, Run
from umbp_sim.engine.subject import BuiltinSubject
from umbp_sim.external.observe import record_from_reply, runner_for
from umbp_sim.external.runner import DEFAULT_RUN_TIMEOUT, ExternalRunner, NoRoom


def run(run: Run) -> RunRecord:
    """``run`` on ``run.allocator``. An external run past its time limit is the outcome
    ``timeout``; one whose process died without a result ``could-not-run``; ``NoRoom`` when
    this process had no real address space for its buffer (not a verdict)."""
    if is_external(run.allocator):
        return record_from_reply(runner_for(parse_allocator_spec(run.allocator)).observe(run))
    if isinstance(run.work, Measure):  # the real kernel: a process of its own
        return measure_in_child(run)
    return execute(run, BuiltinSubject(canonical_profile(run.allocator)))


class OpenedAllocator(Protocol):
    spec: AllocatorSpec

    def run(self, run: Run) -> RunRecord: ...

    def close(self) -> None: ...


class BuiltinAllocator:
    """umbp-sim's own allocator, in this process, with a named policy profile."""

    def __init__(self, spec: AllocatorSpec) -> None:
        self.spec = spec
        self._subject = BuiltinSubject(spec.name)

    def run(self, run: Run) -> RunRecord:
        return execute(run, self._subject)

    def close(self) -> None:
        pass


class ExternalAllocator:
    """An allocator build in a server process of its own (``env``: that process's environment)."""

    def __init__(self, spec: AllocatorSpec, env: dict[str, str] | None, run_timeout: float):
        self.spec = spec
        self.runner = ExternalRunner(spec, env, run_timeout)

    def run(self, run: Run) -> RunRecord:
        try:
            return record_from_reply(self.runner.observe(run))
        except NoRoom as e:
            raise NoRoom(f"{self.spec}: {e}") from None

    def close(self) -> None:
        self.runner.close()


def open_allocator(
    spec: AllocatorSpec, env: dict[str, str] | None = None, run_timeout: float = DEFAULT_RUN_TIMEOUT
) -> OpenedAllocator:
    """An allocator to run ``Run``s on as itself (compare's two sides); ``close()`` it."""
    if spec.kind == "builtin":
        return BuiltinAllocator(spec)
    return ExternalAllocator(spec, env, run_timeout)


__all__ = ["BuiltinAllocator", "ExternalAllocator", "OpenedAllocator", "open_allocator", "run"]
