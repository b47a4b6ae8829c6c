"""What an external run's forked child would otherwise pay on every run is paid once in its
server: the modules a run needs are imported with run_job, and a host's SimConfig is built once
per machine state (engine.execute.host_config) and found again by an equal machine."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from umbp_sim.engine import execute
from umbp_sim.machine import Machine


def test_a_run_imports_nothing_run_job_has_not() -> None:
    # In a fresh interpreter, as the server is: every kind of run of the quick matrix, and the
    # scratch host of no_room, import no umbp_sim module that run_job did not.
    code = textwrap.dedent(
        """
        import sys
        import umbp_sim.external.run_job as run_job
        from umbp_sim.engine.execute import execute
        from umbp_sim.engine.subject import BuiltinSubject
        from umbp_sim.comparison.matrix import quick
        runs = list(quick())
        before = set(sys.modules)
        subject = BuiltinSubject("mori-624002c")
        for run in runs[::7]:
            run_job.prepare(run)
            run_job.no_room(run.machine, 1 << 30)
            execute(run, subject)
        print(sorted(m for m in set(sys.modules) - before if m.startswith("umbp_sim")))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_an_equal_machine_finds_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[Machine] = []
    real = execute.to_sim_config

    def counting(machine: Machine) -> object:
        built.append(machine)
        return real(machine)

    monkeypatch.setattr(execute, "to_sim_config", counting)
    monkeypatch.setattr(execute, "_CONFIGS", {})
    a = Machine.build(nodes=2, hugepages={"2MiB": 8})
    b = Machine.build(nodes=2, hugepages={"2MiB": 8})  # another object, the same state
    assert a is not b
    assert execute.host_config(a) is execute.host_config(b)
    assert built == [a]
    b.nodes[1].hugepages[2 << 20].total = 6  # a changed state is another config
    other = execute.host_config(b)
    assert built == [a, b]
    assert execute.fresh_host(b).node_hugepages(1).total == 6
    assert execute.host_config(b) is other


def test_prepare_says_when_the_server_imported_what_a_forked_child_lacks() -> None:
    # A child forked before torch was imported would import it on every run: the Forker
    # discards it when prepare says True, which it does once, for the first sglang run.
    # The process ends by os._exit: what is asked is prepare's answers, and under `tox -e asan`
    # LeakSanitizer's exit check of a process that imported torch once crashed in its own
    # tracer (signal 11 stopping torch's threads), failing a run that had printed them right.
    code = textwrap.dedent(
        """
        import os, sys
        import umbp_sim.external.run_job as run_job
        from umbp_sim.engine.spec import Run, SglangStartup
        from umbp_sim.comparison.matrix import machine, quick
        alloc = next(iter(quick()))
        startup = Run(machine("pool-on-node0"), SglangStartup(request={}))
        print(run_job.prepare(alloc), run_job.prepare(startup), run_job.prepare(startup),
              run_job.prepare(alloc))
        sys.stdout.flush()
        os._exit(0)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True", "False", "False"]
