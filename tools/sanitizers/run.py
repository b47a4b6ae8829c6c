#!/usr/bin/env python3
"""Run a command (normally pytest) against a sanitizer build of umbp_sim._native.

CPython is not built with a sanitizer, so the runtime must be loaded before anything else:
this script finds it with ``gcc -print-file-name=lib<san>.so`` and runs the command with
``LD_PRELOAD`` and options under which any report fails the run. The script itself runs
unsanitized, so tox's pip steps are never under the preload.

    python tools/sanitizers/run.py address -- python -m pytest
    python tools/sanitizers/run.py thread  -- python -m pytest -k thread

Sanitizers: ``address`` (ASan + LSan + UBSan: the extension is built with
``UMBP_SANITIZE=address,undefined``) and ``thread`` (TSan, ``UMBP_SANITIZE=thread``).

Before running, the installed ``_native`` extension is checked to link the same runtime
(``readelf -d``), so a plain build can never pass silently as a sanitized one.
Suppression files live beside this script; each entry says why it is there.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple
from xml.etree import ElementTree

HERE = Path(__file__).resolve().parent

# Runtimes to preload, in order (ASan must come first in the library list).
RUNTIMES = {"address": ["asan", "ubsan"], "thread": ["tsan"]}


def runtime_path(lib: str) -> str:
    """The shared runtime gcc links for -fsanitize=<lib>, as an absolute existing path."""
    gcc = os.environ.get("CC", "gcc")
    out = subprocess.run(
        [gcc, f"-print-file-name=lib{lib}.so"], capture_output=True, text=True, check=True
    ).stdout.strip()
    path = Path(out)
    if not path.is_absolute() or not path.exists():
        sys.exit(f"run.py: {gcc} has no lib{lib}.so (install the gcc sanitizer runtime)")
    return str(path.resolve())


def installed_extension(python: str) -> Path:
    """The _native extension of the umbp_sim installed for `python` (found without importing:
    importing a sanitized module without the preload aborts)."""
    platlib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    found = glob.glob(os.path.join(platlib, "umbp_sim", "_native*.so"))
    if not found:
        sys.exit(f"run.py: no umbp_sim/_native*.so under {platlib}: is umbp-sim installed?")
    return Path(found[0])


def needed_libs(so: Path) -> list[str]:
    text = subprocess.run(
        ["readelf", "-d", str(so)], capture_output=True, text=True, check=True
    ).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", text)


def sanitizer_env(sanitizer: str, preload: list[str], logs: Path) -> dict[str, str]:
    env = dict(os.environ)
    old = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = ":".join(preload + ([old] if old else []))
    if sanitizer == "address":
        env["ASAN_OPTIONS"] = ":".join(
            [
                "halt_on_error=1",
                "abort_on_error=0",
                "detect_leaks=1",
                # Python's own tests of huge requests expect NULL/MemoryError, as from glibc.
                "allocator_may_return_null=1",
                # A real SIGBUS (hugetlb fault with no page) must kill the process as it would
                # without ASan: the differential tests expect death by signal.
                "handle_sigbus=0",
                "print_summary=1",
                f"log_path={logs / 'asan'}",
            ]
        )
        env["LSAN_OPTIONS"] = ":".join(
            [
                f"suppressions={HERE / 'lsan.supp'}",
                f"print_suppressions={os.environ.get('UMBP_PRINT_SUPPRESSIONS', '0')}",
                "report_objects=1",
            ]
        )
        # CPython's small-object allocator keeps objects in mmap'd arenas that LeakSanitizer
        # does not scan: C++ memory owned by a Python object alive at exit (a module-level
        # LinuxKernel, say) would look leaked. With malloc, LSan sees those pointers, and ASan
        # checks every Python object's memory as well.
        env["PYTHONMALLOC"] = "malloc"
        env["UBSAN_OPTIONS"] = ":".join(
            [
                "halt_on_error=1",
                "print_stacktrace=1",
                "report_error_type=1",
                f"suppressions={HERE / 'ubsan.supp'}",
                f"log_path={logs / 'ubsan'}",
            ]
        )
    else:
        env["TSAN_OPTIONS"] = ":".join(
            [
                "halt_on_error=1",
                "second_deadlock_stack=1",
                f"suppressions={HERE / 'tsan.supp'}",
                "print_suppressions=0",
                f"log_path={logs / 'tsan'}",
            ]
        )
    return env


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("sanitizer", choices=sorted(RUNTIMES))
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- command to run")
    args = p.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        p.error("no command given (put it after --)")

    preload = [runtime_path(lib) for lib in RUNTIMES[args.sanitizer]]
    python = shutil.which(cmd[0]) if cmd[0].startswith("python") else sys.executable
    so = installed_extension(python or sys.executable)
    needed = needed_libs(so)
    want = RUNTIMES[args.sanitizer][0]
    if not any(n.startswith(f"lib{want}.so") for n in needed):
        sys.exit(
            f"run.py: {so} does not link lib{want} (needed: {', '.join(needed)}); build it with "
            f"UMBP_SANITIZE={'address,undefined' if want == 'asan' else 'thread'}"
        )
    if args.sanitizer == "thread":
        # TSan maps its shadow at fixed addresses; with address-space randomisation a library
        # can land there ("unexpected memory mapping"). setarch -R runs without it.
        cmd = ["setarch", os.uname().machine, "-R", *cmd]
    print(f"run.py: LD_PRELOAD={':'.join(preload)}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="umbp-sanitizer-") as tmp:
        return run_retrying_tracer_crashes(args.sanitizer, preload, cmd, Path(tmp))


def run_retrying_tracer_crashes(
    sanitizer: str, preload: list[str], cmd: list[str], tmp: Path
) -> int:
    """Run `cmd`; if it is pytest, it failed, no process reported, and LeakSanitizer's own
    tracer crashed in at least as many processes as tests failed, run the failed tests once more
    and take that verdict.

    LSan's stop-the-world tracer sometimes dies of SIGSEGV at a process's exit ("Tracer caught
    signal 11", google/sanitizers#1353: seen once in ~1,700 tests here, not reproduced in 800
    runs of the same child): the process exits 1 with no report, and a test that checks its
    exit status fails. Only those tests run again; a report anywhere still fails the run."""
    junit = tmp / "junit.xml"
    pytest = is_pytest(cmd) and not any(a.startswith("--junitxml") for a in cmd)
    first = run_once(sanitizer, preload, [*cmd, *junit_args(junit)] if pytest else cmd, tmp)
    failed = failed_tests(junit) if pytest and first.rc and not first.reports else []
    if not failed or len(failed) > first.tracer_crashes:
        return first.verdict()
    print(
        f"run.py: LeakSanitizer's own tracer crashed in {first.tracer_crashes} process(es) "
        f"with no report, and {len(failed)} test(s) failed: running them once more:",
        *failed,
        sep="\n  ",
        file=sys.stderr,
        flush=True,
    )
    return run_once(sanitizer, preload, [*cmd, *failed], tmp).verdict()


class Outcome(NamedTuple):
    rc: int
    reports: int  # processes whose log holds a sanitizer report
    tracer_crashes: int  # processes whose leak check died in LSan's tracer, with no report

    def verdict(self) -> int:
        return self.rc or (1 if self.reports else 0)


def run_once(sanitizer: str, preload: list[str], cmd: list[str], tmp: Path) -> Outcome:
    """Run `cmd` with the sanitizer's environment and logs in a fresh directory under `tmp`."""
    logs = Path(tempfile.mkdtemp(prefix="logs-", dir=tmp))
    rc = subprocess.run(cmd, env=sanitizer_env(sanitizer, preload, logs)).returncode
    reports, crashes = report_logs(logs)  # printed even when the command failed
    return Outcome(rc, reports, crashes)


def is_pytest(cmd: list[str]) -> bool:
    names = [Path(a).name for a in cmd[:4]]
    return names[0] == "pytest" or ("-m" in names and "pytest" in names)


def junit_args(junit: Path) -> list[str]:
    # xunit1 keeps each test's file, from which its node id is rebuilt exactly.
    return [f"--junitxml={junit}", "-o", "junit_family=xunit1"]


def failed_tests(junit: Path) -> list[str]:
    """Node ids of the failed or errored tests in a pytest JUnit XML file (xunit1)."""
    try:
        root = ElementTree.parse(junit).getroot()
    except (OSError, ElementTree.ParseError):
        return []
    failed = []
    for case in root.iter("testcase"):
        if case.find("failure") is None and case.find("error") is None:
            continue
        file, classname, name = case.get("file"), case.get("classname", ""), case.get("name")
        if not file or not name:
            return []  # not a test item we can name again
        module = file.removesuffix(".py").replace("/", ".")
        classes = classname[len(module) :].lstrip(".") if classname.startswith(module) else ""
        failed.append("::".join([file, *filter(None, classes.split(".")), name]))
    return failed


# What marks a sanitizer log as a report (not just "Suppressions used" statistics).
REPORT_MARKERS = ("ERROR: ", "WARNING: ThreadSanitizer", "runtime error:")


# What LeakSanitizer writes when its own tracer dies (no leak check was made).
TRACER_CRASH = "LeakSanitizer has encountered a fatal error"


def report_logs(logs: Path) -> tuple[int, int]:
    """Reports go to files (log_path), one per process: pytest's output capture would swallow
    a report written to stderr by a process that then exits, and a child process's report
    would otherwise count only if its parent checked the exit status. Print them all; any
    report fails the run. Returns (processes that reported, tracer crashes without a report)."""
    reports = crashes = 0
    for log in sorted(logs.iterdir()):
        text = log.read_text(errors="replace")
        print(f"run.py: {log.name}:\n{text}", file=sys.stderr)
        reported = any(m in text for m in REPORT_MARKERS)
        reports += reported
        crashes += not reported and TRACER_CRASH in text
    if reports:
        print(f"run.py: {reports} process(es) reported", file=sys.stderr)
    return reports, crashes


if __name__ == "__main__":
    sys.exit(main())
