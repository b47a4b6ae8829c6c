"""The simulated host of a program ``umbp-sim exec`` runs: which machine, and the private
directory that describes it to the interposer inside the program.

A C++ test binary has no Python to build its SimKernel, so the host travels as data: umbp-sim
writes a private directory (``HostDir``) and names it in ``UMBP_SIM_EXEC``; the preloaded
interposer reads it before the program's ``main()`` (csrc/interposer/exec_mode.cpp) and starts
the host with libumbp_sim_exec.so (csrc/capi/exec_host.h):

- ``host.json``: ``{"format": 1, "sim_config": {...}, "fault_rules": [...], "trace_limit": N}``,
  the ``SimConfig`` that ``sim.to_sim_config`` fills from the Machine and the ``FaultRule``s of the
  fault plan, each field by the name the binding gives it (a field the C++ reader does not know,
  or one it misses, is an error naming it: the two change together);
- ``root/``: the host's /proc and /sys as rendered at start (``SimHost.render``), which lists its
  directories (the node directories, the hugepage sizes) and holds the files the Kernel does not
  render (process limits, cgroup files);
- ``token``: 32 random hex digits, the run's, which the interposer puts first in every frame it
  writes on the evidence pipe (csrc/interposer/death.cpp); umbp-sim reads no frame without it
  (``evidence.EvidenceReader``), so bytes the program writes on the pipe's fd by accident are
  never taken for the interposer's. It is not a secret from the program (it can read the
  directory): the program's own code could forge a frame, and what it forges is read within
  bounds and ends nothing (``umbp_sim.external.wire``).

The directory is removed when the run ends, however it ends.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from umbp_sim.errors import UmbpSimError
from umbp_sim.external.exec_program import (
    EVIDENCE_ENV,
    EXEC_ENV as EXEC_ENV,  # exec_run's, through here
    leave_exec,
)
from umbp_sim.vocabulary.exit_codes import EX_CANTCREAT, EX_USAGE

if TYPE_CHECKING:  # the command's --help imports this module: nothing of the extension
    from umbp_sim.faults import FaultPlan
    from umbp_sim.machine import Machine

HOST_FORMAT = 1  # csrc/capi/exec_host.h UMBP_SIM_EXEC_HOST_FORMAT
TRACE_LIMIT = 100_000  # syscall records kept (the TracingKernel's default)

# Named machines: the 2-node hosts compare also runs on (umbp_sim/host/named_machines.py).
NAMED_MACHINES = {
    "ample": "2 nodes of 64 GiB, 1024 x 2 MiB and 2 x 1 GiB hugepages on each, kernel 6.8.0",
    "pool-on-node0": "2 nodes of 64 GiB, 64 x 2 MiB and 1 x 1 GiB hugepages on node 0 only",
    "no-pool": "2 nodes of 64 GiB, no hugepages",
}
DEFAULT_MACHINE = "ample"


def out_of_exec() -> None:
    """First thing in an ``umbp-sim`` process whose environment has an exec run's variables.
    Started by ``umbp-sim exec`` (its interposer is loaded here): umbp-sim starts again without
    the interposer and the variables, and runs as it does outside exec (its commands simulate
    hosts of their own; under the program's host its allocator servers started that host too
    and its own runs' deaths were reported as the program's). A stray variable otherwise:
    dropped, so that nothing umbp-sim starts inherits it."""
    interposer = "libumbp_sim_interpose.so"
    try:
        with open("/proc/self/maps") as f:
            loaded = any(line.rstrip().endswith("/" + interposer) for line in f)
    except OSError:
        loaded = False
    evidence = os.environ.get(EVIDENCE_ENV, "")
    leave_exec(os.environ)
    if not loaded:
        return
    import re
    import sys

    kept = [n for n in re.split(r"[ :]+", os.environ.get("LD_PRELOAD", ""))
            if n and os.path.basename(n) != interposer]  # fmt: skip
    env = dict(os.environ, LD_PRELOAD=" ".join(kept))
    if not kept:
        del env["LD_PRELOAD"]
    fd = evidence.split(":", 1)[0]
    if fd.isdigit():
        try:
            os.set_inheritable(int(fd), False)  # the program's evidence pipe: not ours to pass
        except OSError:
            pass
    os.execve(sys.executable, sys.orig_argv, env)


class ExecUsageError(UmbpSimError):
    """Bad input to ``umbp-sim exec``: one line naming the argument."""

    exit_code = EX_USAGE


class ReportNotWritable(UmbpSimError):
    """``--json FILE`` cannot be written (exit 73): checked before the program runs."""

    exit_code = EX_CANTCREAT


def check_report_path(path: str) -> None:
    """Deprecated: ``umbp_sim.vocabulary.output_file.OutputFile(path, "--json")`` checks exec's
    --json FILE as every output file is checked (OutputFileError, exit 73)."""
    from umbp_sim.vocabulary.output_file import OutputFile

    OutputFile(path, "--json")


def load_machine(arg: str | None) -> tuple[Machine, str]:
    """The machine ``--machine`` names (a named machine, or a dump directory or tarball) and
    where it came from ("named machine ample", "dump /path")."""
    from umbp_sim.host.named_machines import machine as named_machine

    name = arg or DEFAULT_MACHINE
    if name in NAMED_MACHINES:
        m = named_machine(name).copy()
        m.name = name
        return m, f"named machine {name}"
    path = Path(name)
    if not path.exists():
        names = ", ".join(NAMED_MACHINES)
        raise ExecUsageError(f"--machine {name}: no such dump (file or directory) or named "
                             f"machine ({names})")  # fmt: skip
    from umbp_sim.dump import load_dump

    try:
        machine = load_dump(str(path))[0]
    except UmbpSimError as e:
        raise ExecUsageError(f"--machine {name}: {e}") from None
    return machine, f"dump {name}"


def load_plan(arg: str | None) -> FaultPlan | None:
    """The fault plan ``--faults`` names (a TOML file of ``[[faults]]`` tables)."""
    from umbp_sim.faults import FaultPlan

    if arg is None:
        return None
    if not os.path.isfile(arg):
        raise ExecUsageError(f"--faults {arg}: no such file")
    try:
        return FaultPlan.from_toml(arg)
    except UmbpSimError as e:  # it names the file: "PLAN.toml: faults[0].op: ..."
        raise ExecUsageError(f"--faults {e}") from None


def native_fields(obj: Any) -> Any:
    """A ``_native`` value object (SimConfig, SimNodeConfig, FaultRule, ...) as JSON data: every
    property by its name, maps with their keys as strings."""
    if isinstance(obj, (bool, int, float, str)) or obj is None:
        return obj
    if isinstance(obj, (list, tuple)):
        return [native_fields(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): native_fields(v) for k, v in obj.items()}
    props = [n for n, v in vars(type(obj)).items() if isinstance(v, property)]
    return {n: native_fields(getattr(obj, n)) for n in sorted(props)}


def host_document(machine: Machine, plan: FaultPlan | None) -> dict[str, Any]:
    """What ``host.json`` holds (csrc/capi/exec_host.h)."""
    from umbp_sim.sim import to_sim_config

    rules = plan.native_rules() if plan is not None else []
    return {
        "format": HOST_FORMAT,
        "sim_config": native_fields(to_sim_config(machine)),
        "fault_rules": [native_fields(r) for r in rules],
        "trace_limit": TRACE_LIMIT,
    }


class HostDir:
    """The private directory describing the host (``with HostDir(machine, plan) as d``)."""

    def __init__(self, machine: Machine, plan: FaultPlan | None) -> None:
        self.machine = machine
        self.plan = plan
        self.path = ""
        self.token = secrets.token_hex(16)

    def __enter__(self) -> HostDir:
        from umbp_sim.sim import SimHost

        doc = host_document(self.machine, self.plan)  # a bad machine fails before the mkdtemp
        self.path = tempfile.mkdtemp(prefix="umbp-sim-exec-")
        try:
            with open(os.path.join(self.path, "host.json"), "w") as f:
                json.dump(doc, f)
            with open(os.path.join(self.path, "token"), "w") as f:
                f.write(self.token)
            SimHost(self.machine).render(os.path.join(self.path, "root"))
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def remove(self) -> None:
        if self.path:
            shutil.rmtree(self.path, ignore_errors=True)


def describe_host(machine: Machine) -> str:
    """One line: "x86_64, 2 nodes, kernel 6.8.0, hugepages 2MiB: 1024+1024, 1GiB: 2+2"."""
    from umbp_sim.vocabulary.units import format_size

    nodes = machine.nodes
    pools = []
    for size in machine.hugepage_sizes:
        counts = [n.hugepages[size].total if size in n.hugepages else 0 for n in nodes]
        if any(counts):
            pools.append(f"{format_size(size)}: {'+'.join(str(c) for c in counts)}")
    hp = ", hugepages " + ", ".join(pools) if pools else ", no hugepages"
    plural = "s" if len(nodes) != 1 else ""
    return f"{machine.arch}, {len(nodes)} node{plural}, kernel {machine.kernel_version}{hp}"
