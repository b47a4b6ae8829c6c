"""``umbp-sim exec``: run a program with its OS calls on a simulated host, and say what happened.

The program runs with the interposer preloaded (after a sanitizer runtime it needs, before what
was preloaded already: ``umbp_sim.external.exec_program``, which also refuses a program the
interposer cannot reach) and the host's private directory named in its environment
(``umbp_sim.exec_host.machine_dir``). Its keeper (``umbp_sim.exec_host.keeper``) starts it in a
process group of its own and holds its whole tree: the tree is ended when the program exits,
when it runs past ``--run-timeout``, when umbp-sim is ended by a signal, and when umbp-sim dies
(SIGKILL: the keeper removes the host directory too). When
umbp-sim runs in the foreground of a terminal, the program's group gets the terminal, as a
shell's job does: Ctrl-C goes to the program (pytest prints its summary, a debugger reads the
terminal), and its exit status is umbp-sim's.

What the interposer saw comes as frames on an evidence pipe of the run's own
(``umbp_sim.external.evidence``), each naming its process: a simulated death (signal,
SimKernel's crash record and reasons, the trace), or at a normal exit the interposer's counters
and SimKernel's reasons and trace. Nothing is parsed from the program's output: it inherits
umbp-sim's stdin, stdout and stderr.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from umbp_sim.errors import UmbpSimError
from umbp_sim.exec_host.keeper import ProgramKeeper
from umbp_sim.exec_host.machine_dir import (
    EVIDENCE_ENV,
    EXEC_ENV,
    ExecUsageError,
    HostDir,
    describe_host,
    leave_exec,
)
from umbp_sim.external.evidence import Death, EvidenceReader, ProgramExit, SetupError
from umbp_sim.external.exec_program import inspect, leak_check_off, preload_list
from umbp_sim.external.procs import signal_name, wait_readable
from umbp_sim.faults import FaultPlan
from umbp_sim.machine import Machine
from umbp_sim.vocabulary.exit_codes import EX_SOFTWARE, EX_TEMPFAIL

# EX_TEMPFAIL: the program ran past --run-timeout (as replay's and compare's runs)


class HostDidNotStart(UmbpSimError):
    """The interposer could not start the simulated host in the program (exit 70)."""

    exit_code = EX_SOFTWARE


@dataclass
class ExecReport:
    """What ``umbp-sim exec`` reports (``--json``): the command, the host, how the program
    ended, and what the simulated host saw."""

    command: list[str]
    host: str  # the Machine's name
    host_source: str  # "named machine ample", "dump PATH"
    host_summary: str  # describe_host
    fault_rules: int
    exit_status: int  # the command's (a death by a signal: 128 + it); 75: past --run-timeout
    ended_by: str | None = None  # the signal's name when a signal ended the program
    timed_out: float | None = None  # --run-timeout, when the program ran past it
    simulated_calls: int | None = None  # calls the simulated host answered (None: no record)
    page_faults: int | None = None  # touches of simulated mappings handled
    death: dict[str, Any] | None = None  # evidence.Death as data, when the host killed it
    reasons: list[dict[str, Any]] = field(default_factory=list)  # SimKernel's, of the program
    trace: list[str] = field(default_factory=list)
    other_processes: list[dict[str, Any]] = field(default_factory=list)  # what it started
    other_processes_not_kept: int = 0  # past evidence.OTHERS_KEPT: counted, not listed
    # "a frame on the evidence channel was not umbp-sim's: ...": the reading ended there
    evidence_problem: str | None = None
    # Why the program ran on this box's real host (--allow-real-host: "a static program ...");
    # None: it ran with the interposer, on the simulated host
    not_simulated: str | None = None
    sanitizer_runtimes: list[str] = field(default_factory=list)  # preloaded before the interposer
    leak_check_off: bool = False  # ASAN_OPTIONS detect_leaks=0 added (exec_program says why)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def paragraph(self) -> str:
        """The report for a person (stderr), one paragraph."""
        cmd = " ".join(shlex.join(self.command).split())
        if len(cmd) > 80:
            cmd = cmd[:77] + "..."
        faults = f" with {self.fault_rules} fault rule{'s' * (self.fault_rules != 1)}"
        host = (
            f"the simulated host {self.host} ({self.host_source}: {self.host_summary})"
            f"{faults if self.fault_rules else ''}"
        )
        if self.not_simulated is not None:
            text = (
                f"umbp-sim exec: `{cmd}` ran on this box's real host, not on {host}: it is "
                f"{self.not_simulated}, which the interposer cannot reach (--allow-real-host)"
            )
        else:
            verb = "was started on" if self.simulated_calls is None else "ran on"
            text = f"umbp-sim exec: `{cmd}` {verb} {host}; "
            if self.sanitizer_runtimes:
                runtimes = ", ".join(self.sanitizer_runtimes)
                text += f"its sanitizer runtime {runtimes} loaded before the interposer"
                text += " (LeakSanitizer off); " if self.leak_check_off else "; "
            if self.simulated_calls is None:
                text += f"no record from the simulated host ({self._why_no_record()})"
            else:
                text += f"{self.simulated_calls} calls answered by the simulated host, "
                text += f"{self.page_faults} page faults"
        if self.timed_out is not None:
            text += f"; it ran past --run-timeout {self.timed_out:g} s and was ended"
        elif self.death is not None:
            text += f"; killed by a simulated {self.death['signal']} in {self.death['stage']}: "
            text += self.death["detail"]
            why = [r["text"] for r in self.death["reasons"] if r["text"] not in text]
            if why:
                text += " (after: " + "; ".join(why[-3:]) + ")"
        elif self.ended_by is not None:
            text += f"; ended by {self.ended_by}"
        for other in [p for p in self.other_processes if "death" in p][:3]:
            d = other["death"]
            text += (
                f"; process {other['pid']} it started was killed by a simulated {d['signal']} "
                f"in {d['stage']}: {d['detail']}"
            )
        if self.evidence_problem is not None:
            text += f"; {self.evidence_problem}"
        failed = [r for r in self.reasons if r["errno"]]
        if failed:
            text += f"; {len(failed)} call{'s' * (len(failed) != 1)} failed on it"
            text += " (" + "; ".join(f"{r['call']}: {r['errno']}" for r in failed[:3])
            text += ", ..." if len(failed) > 3 else ""
            text += ")"
        return text + f". Exit status {self.exit_status}."

    def _why_no_record(self) -> str:
        if self.ended_by is not None:
            return f"the program was ended by {self.ended_by}"
        if self.timed_out is not None:
            return "it was ended at the time limit"
        return (
            "the program ended without exit() (by _exit() or an exec of another program) or "
            "closed its evidence pipe"
        )


def _death_data(d: Death) -> dict[str, Any]:
    data = asdict(d)
    data["detail"] = d.detail
    return data


def _terminal() -> int | None:
    """stdin's fd when it is the terminal umbp-sim runs in the foreground of (else None)."""
    try:
        fd = sys.stdin.fileno()
        return fd if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp() else None
    except (AttributeError, ValueError, OSError):
        return None


def _give_terminal(fd: int | None, pgid: int) -> None:
    """Make ``pgid`` the terminal's foreground group (as a shell does for a job: Ctrl-C and a
    read of the terminal go to the program's group, which is not umbp-sim's)."""
    if fd is None:
        return
    old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # a background group may not, else
    try:
        os.tcsetpgrp(fd, pgid)
    except OSError:
        pass
    finally:
        signal.signal(signal.SIGTTOU, old)


def _in_program(terminal: int | None) -> None:
    os.setpgid(0, 0)
    _give_terminal(terminal, os.getpid())


def run_program(
    command: Sequence[str],
    machine: Machine,
    source: str,
    plan: FaultPlan | None,
    timeout: float,
    interposer: str,
    allow_real_host: bool = False,
) -> ExecReport:
    """Run ``command`` on ``machine`` (with ``plan``'s faults), at most ``timeout`` seconds. A
    program the interposer cannot reach (``exec_program``) is refused (``ExecUsageError``)
    unless ``allow_real_host``: then it runs, and the report says it ran on the real host."""
    env = leave_exec(dict(os.environ))  # a stray host of someone else's is not this run's
    program = inspect(command[0], env)
    not_simulated = program.unreachable if program is not None else None
    if not_simulated is not None and not allow_real_host:
        raise ExecUsageError(
            f"CMD {command[0]}: {not_simulated}: the interposer cannot reach it, so it would run "
            "on this box's real host, not the simulated one (--allow-real-host runs it there)"
        )
    sanitizers = program.sanitizers if program is not None else ()
    leaks_off = leak_check_off(env, sanitizers)
    # The sanitizer runtimes first, the interposer next, then what was preloaded already.
    env["LD_PRELOAD"] = preload_list(env.get("LD_PRELOAD", ""), interposer, sanitizers)
    with HostDir(machine, plan) as host:
        rfd, wfd = os.pipe()
        try:
            st = os.fstat(wfd)
            env[EXEC_ENV] = host.path
            env[EVIDENCE_ENV] = f"{wfd}:{st.st_dev}:{st.st_ino}"
            terminal = _terminal()
            try:
                keeper = ProgramKeeper(
                    command, env, wfd, lambda _keeper: _in_program(terminal), host.path
                )
            except OSError as e:
                raise ExecUsageError(f"CMD {command[0]}: {e.strerror or e}") from None
            os.close(wfd)
            wfd = -1
            try:
                reader, timed_out = _watch(keeper, rfd, timeout, host.token)
                returncode = keeper.end() if timed_out else keeper.returncode()
            finally:
                keeper.close()  # the program's tree is ended (it went with it at its exit)
                _give_terminal(terminal, os.getpgrp())
            _drain(rfd, reader)
        finally:
            os.close(rfd)
            if wfd >= 0:
                os.close(wfd)
    ran_out = timeout if timed_out else None
    report = _report(command, machine, source, plan, keeper.pid, returncode, ran_out, reader)
    report.not_simulated = not_simulated
    report.sanitizer_runtimes = list(sanitizers)
    report.leak_check_off = leaks_off
    return report


def _watch(
    keeper: ProgramKeeper, rfd: int, timeout: float, token: str
) -> tuple[EvidenceReader, bool]:
    """Read the evidence until the program exits (the keeper says so, its tree ended) or runs
    out of time: (the evidence, whether it timed out). A process the program started may hold
    the pipe open: the program's exit ends the reading, not the pipe's end."""
    reader = EvidenceReader(program=keeper.pid, token=token)
    deadline = time.monotonic() + timeout
    pipes = [rfd]
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return reader, True
        ready = wait_readable(pipes + [keeper.status_fd], left)
        if rfd in ready:
            data = os.read(rfd, 1 << 16)
            if data:
                reader.feed(data)
                continue
            pipes = []
        if keeper.status_fd in ready:
            return reader, False


def _drain(rfd: int, reader: EvidenceReader) -> None:
    """What the program's tree wrote before it ended (its writers are gone: the keeper waited)."""
    os.set_blocking(rfd, False)
    while True:
        try:
            data = os.read(rfd, 1 << 16)
        except BlockingIOError:
            return
        if not data:
            return
        reader.feed(data)


def _report(
    command: Sequence[str],
    machine: Machine,
    source: str,
    plan: FaultPlan | None,
    pid: int,
    returncode: int,
    timed_out: float | None,
    reader: EvidenceReader,
) -> ExecReport:
    """The report of the program ``pid`` (Popen's ``returncode``: -N for a death by signal N)."""
    errors: list[SetupError] = [e for e in reader.errors if e.pid == pid]
    if errors and returncode == EX_SOFTWARE:
        raise HostDidNotStart(errors[-1].text)
    if timed_out is not None:
        code, ended_by = EX_TEMPFAIL, None
    elif returncode < 0:
        code, ended_by = 128 - returncode, signal_name(-returncode)
    else:
        code, ended_by = returncode, None
    deaths = [d for d in reader.deaths if d.pid == pid]
    exits = [e for e in reader.exits if e.pid == pid]
    death = deaths[-1] if deaths and ended_by is not None and timed_out is None else None
    record: Death | ProgramExit | None = death or (exits[-1] if exits else None)
    report = ExecReport(
        command=list(command),
        host=machine.name,
        host_source=source,
        host_summary=describe_host(machine),
        fault_rules=len(plan.rules) if plan is not None else 0,
        exit_status=code,
        ended_by=ended_by,
        timed_out=timed_out,
        death=_death_data(death) if death is not None else None,
        other_processes_not_kept=reader.others_dropped,
        evidence_problem=reader.problem,
    )
    if record is not None and record.counts is not None:
        report.simulated_calls = record.counts.routed
        report.page_faults = record.counts.faults
    if record is not None:
        report.reasons = [asdict(r) for r in record.reasons]
        report.trace = list(record.trace)
    for d in reader.deaths:
        if d.pid != pid:
            report.other_processes.append({"pid": d.pid, "death": _death_data(d)})
    for e in reader.exits:
        if e.pid != pid:
            report.other_processes.append(
                {"pid": e.pid, "exit": True, "simulated_calls": e.counts.routed}
            )
    for err in reader.errors:
        if err.pid != pid:
            report.other_processes.append({"pid": err.pid, "error": err.text})
    return report
