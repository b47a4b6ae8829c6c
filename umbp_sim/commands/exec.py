"""``umbp-sim exec [--machine DUMP|NAME] [--faults PLAN.toml] -- CMD ARGS...``: run any program
(mori's C++ test binary, pytest on mori's Python tests, a benchmark) with its OS calls on a
simulated host, as umockdev-run or faketime do.

The program runs with umbp-sim's interposer preloaded; before its ``main()`` the interposer
starts a SimKernel from the machine (and the fault plan) that umbp-sim hands it as data, and from
then on the program's memory calls (mmap, munmap, madvise, mbind, memfd_create, ftruncate,
close, sysconf(_SC_PAGESIZE)) and its reads and listings of the host's /proc and /sys files go to
the simulated host, on every thread; the language runtime's own calls (the C and C++ libraries,
the Python interpreter's arenas) stay on this box (csrc/interposer/routing.cpp says why).
A program it execs gets a fresh copy of the same host.

A program the interposer cannot reach (static; set-user-ID, set-group-ID or with file
capabilities) is refused unless --allow-real-host; a program linked with a sanitizer runtime
gets it loaded before the interposer; what was preloaded already comes after the interposer.

Exit status: the program's (a death by a signal, simulated or not, is 128 + the signal: 135 for
a simulated SIGBUS); 64 for bad input (a missing dump, a bad fault plan, no CMD, a program the
interposer cannot reach), 70 when the simulated host cannot start in the program, 73 when
--json cannot be written; 130, 143, 129 when umbp-sim is ended by Ctrl-C, SIGTERM or SIGHUP,
128 + N by another signal N whose default would end it (the program's tree is ended first).
One paragraph on stderr says which host it ran on, how many calls the simulated host answered,
and why the program died when the host killed it; ``--json FILE`` writes the same as data.
"""

from __future__ import annotations

import argparse

from umbp_sim.vocabulary.flag_types import seconds_flag

DEFAULT_TIMEOUT = 600.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from umbp_sim.exec_host.machine_dir import DEFAULT_MACHINE, NAMED_MACHINES

    names = "; ".join(f"{n}: {d}" for n, d in NAMED_MACHINES.items())
    parser.add_argument(
        "--machine",
        metavar="DUMP|NAME",
        default=None,
        help=f"the simulated host: a dump (directory or tarball from `umbp-sim collect`) or a "
        f"named machine ({names}). Default: {DEFAULT_MACHINE}, a 2-node host with 2 MiB "
        f"hugepages on both nodes",
    )
    parser.add_argument(
        "--faults", metavar="PLAN.toml", default=None,
        help="a fault plan: [[faults]] tables (see umbp_sim.faults) applied to the program's calls",
    )  # fmt: skip
    parser.add_argument(
        "--run-timeout", type=seconds_flag, default=DEFAULT_TIMEOUT, metavar="SECONDS",
        help=f"end the program (and what it started) after this long (default "
        f"{DEFAULT_TIMEOUT:g} s)",
    )  # fmt: skip
    parser.add_argument(
        "--allow-real-host", action="store_true",
        help="run a program the interposer cannot reach (a static program; a set-user-ID, "
        "set-group-ID or file-capability one) on this box's real host instead of refusing it; "
        "the report says it ran there",
    )  # fmt: skip
    parser.add_argument("--json", metavar="FILE", help="write the report as JSON to FILE")
    parser.add_argument(
        "program", nargs=argparse.REMAINDER, metavar="-- CMD ARGS",
        help="the program and its arguments, after --",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from umbp_sim.external.procs import TERMINATING_SIGNALS, ended_by_signals

    # Any signal whose default would end umbp-sim ends it through its clean-up (the program's
    # tree, the host directory): SIGTERM, SIGHUP, and a stray SIGUSR1, SIGALRM...
    with ended_by_signals(TERMINATING_SIGNALS):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    import json
    import sys

    from umbp_sim.capi import interposer_path
    from umbp_sim.exec_host.machine_dir import ExecUsageError, load_machine, load_plan
    from umbp_sim.exec_host.program_run import run_program
    from umbp_sim.external.interposer import Interposer
    from umbp_sim.vocabulary.output_file import OutputFile

    command = list(args.program)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ExecUsageError("CMD: no command given (umbp-sim exec [options] -- CMD ARGS...)")
    machine, source = load_machine(args.machine)
    plan = load_plan(args.faults)
    # before the run: a link, a FIFO, a device or no directory is refused now, not after it
    out = OutputFile(args.json, "--json") if args.json else None
    problem = Interposer(interposer_path()).fault_path_problem()
    if problem:
        raise ExecUsageError(problem)
    report = run_program(
        command, machine, source, plan, args.run_timeout, interposer_path(),
        allow_real_host=args.allow_real_host,
    )  # fmt: skip
    print(report.paragraph(), file=sys.stderr)
    if out is not None:
        out.write(json.dumps(report.to_json(), indent=2) + "\n")
    return report.exit_status
