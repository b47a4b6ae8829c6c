"""Every exit status of every command, declared once: a name for each and what it means.

The command line's ``--help`` lists ``EXIT_CODES`` (cli.py), docs/commands.md's table lists the same
codes (tests/test_package_fit.py), and every error class and command takes its status from a
name here (tests/test_package_fit.py lists the files that still spell one as a number). The
stand-alone collectors cannot import umbp_sim: collect.py keeps its two
(``EX_USAGE``, ``EX_CANTCREAT``), collect.sh has them written by tools/generated.py, and
tests/test_package_fit.py checks both against these.
"""

from __future__ import annotations

EX_OK = 0
EX_NEGATIVE = 1  # a negative answer (run: a scenario failed; preflight: demoted; compare: differ)
EX_FAILS = 2  # preflight: the request fails or kills the process
EX_DISAGREE = 3  # preflight --verify: the real allocation disagrees with the prediction
EX_USAGE = 64  # sysexits.h from here on
EX_DATAERR = 65
EX_NOINPUT = 66
EX_SOFTWARE = 70
EX_CANTCREAT = 73
EX_TEMPFAIL = 75
EX_SIGHUP = 129  # 128 + the signal, as a shell reports a death by it
EX_INTERRUPTED = 130  # Ctrl-C (SIGINT)
EX_SIGTERM = 143

EXIT_CODES: dict[int, str] = {
    EX_OK: "success: run: every scenario passed; probe: every backing behaved; preflight: the "
    "request gets what it asks for; replay, inspect, collect: done; exec: the program's own exit "
    "status, whatever it is (a death by a signal: 128 + the signal, 135 for a simulated SIGBUS)",
    EX_NEGATIVE: "a negative answer: run: a scenario failed or none matched; probe: a backing "
    "did not get what it asked for; preflight: the request is demoted (or not bound to its node)",
    EX_FAILS: "preflight: the request fails or kills the process (replay of several dumps: the "
    "worst host's 0/1/2)",
    EX_DISAGREE: "preflight --verify: the real allocation on this host disagrees with the "
    "prediction",
    EX_USAGE: "bad usage: an unknown flag, a bad argument or environment value (one line names it)",
    EX_DATAERR: "bad input data: a scenario file, dump, paste or fault rule (one line "
    "names the file and key)",
    EX_SOFTWARE: "an internal error: a bug in umbp-sim (one line; UMBP_SIM_TRACEBACK=1 prints "
    "the traceback); exec: the simulated host could not start in the program",
    EX_NOINPUT: "replay, inspect, preflight --root: a dump argument names no file (or, for a "
    "fleet, no dump)",
    EX_CANTCREAT: "an output file cannot be written (collect's tarball, an --html page, a "
    "--junit file, exec's --json) or is refused (at a link, directory, FIFO or device)",
    EX_TEMPFAIL: "replay, preflight: an external --allocator's run (or its import) went past "
    "--run-timeout (one line names the stage), or could not run under umbp-sim's own ulimit -v "
    "(one line names it); exec: the program went past --run-timeout (it and what it started "
    "were ended)",
    EX_SIGHUP: "run, replay, preflight, compare, exec, build-allocator: ended by SIGHUP (every "
    "process it started ended first)",
    EX_INTERRUPTED: "interrupted (Ctrl-C)",
    EX_SIGTERM: "run, replay, preflight, compare, exec, build-allocator: ended by SIGTERM (every "
    "process it started ended first)",
}
