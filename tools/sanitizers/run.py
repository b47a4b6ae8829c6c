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
                # GCC 12's libasan cannot read glibc 2.36's dynamic TLS ("__tls_get_addr: Can't
                # guess glibc version" at verbosity 2) and records a bogus block (seen: "DTLS 7 at
                # 0x3254-0x2000004356") that LeakSanitizer's tracer then scans and dies on at exit
                # ("Tracer caught signal 11", exit 1, no report). Whether a process hits it depends
                # on its memory layout (PYTHONHASHSEED, which tox draws anew each run): two CI runs
                # failed on it, each in another test. Dynamic TLS is then not a root: a leak
                # reachable only from a dlopen'ed library's thread_local would be reported.
                "intercept_tls_get_addr=0",
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
    with tempfile.TemporaryDirectory(prefix="umbp-sanitizer-") as tmp:
        env = sanitizer_env(args.sanitizer, preload, Path(tmp))
        print(f"run.py: LD_PRELOAD={env['LD_PRELOAD']}", file=sys.stderr, flush=True)
        rc = subprocess.run(cmd, env=env).returncode
        reported = report_logs(Path(tmp))  # printed even when the command failed
        return rc or reported


# What marks a sanitizer log as a report (not just "Suppressions used" statistics). The last:
# LeakSanitizer died in its own tracer, so that process's leaks were never checked.
REPORT_MARKERS = (
    "ERROR: ",
    "WARNING: ThreadSanitizer",
    "runtime error:",
    "LeakSanitizer has encountered a fatal error",
)


def report_logs(logs: Path) -> int:
    """Reports go to files (log_path), one per process: pytest's output capture would swallow
    a report written to stderr by a process that then exits, and a child process's report
    would otherwise count only if its parent checked the exit status. Print them all; any
    report fails the run."""
    reports = 0
    for log in sorted(logs.iterdir()):
        text = log.read_text(errors="replace")
        print(f"run.py: {log.name}:\n{text}", file=sys.stderr)
        reports += any(m in text for m in REPORT_MARKERS)
    if reports:
        print(f"run.py: {reports} process(es) reported", file=sys.stderr)
    return 1 if reports else 0


if __name__ == "__main__":
    sys.exit(main())
