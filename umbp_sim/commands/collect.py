"""``umbp-sim collect -o FILE.tar.gz [--name NAME] [--pid PID]``: dump this host for replay.

``umbp-sim collect --script [py|sh]`` prints the stand-alone collector (stdlib python3 or POSIX
sh, ``umbp_sim/collect_scripts/``) to copy to a host where umbp-sim cannot be installed.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-o",
        "--output",
        metavar="FILE.tar.gz",
        help="tarball to write (.tar, .tar.gz, .tar.bz2, .tar.xz; '-': gzip to stdout); "
        "a new file or a regular one (replaced atomically), never a link, directory or device",
    )
    parser.add_argument("--name", help="top directory inside the tarball (default: hostname)")
    parser.add_argument(
        "--pid",
        type=int,
        metavar="PID",
        help="record the limits, cgroup and NUMA policy this process (the server) saw",
    )
    parser.add_argument(
        "--script",
        nargs="?",
        const="py",
        choices=("py", "sh"),
        help="print the stand-alone collector (py: python3 stdlib only, sh: POSIX sh) and exit",
    )
    parser.set_defaults(_collect_parser=parser)  # -o is required unless --script


def run(args: argparse.Namespace) -> int:
    if args.script:
        from umbp_sim.collect_scripts import script_text

        sys.stdout.write(script_text(args.script))
        return 0
    if not args.output:
        args._collect_parser.error(
            "the following arguments are required: -o/--output (or --script)"
        )
    if args.pid is not None:
        return _collect_pid(args)
    from umbp_sim.live_dump import collect

    res = collect(args.output, args.name)
    where = "the tarball to stdout" if res.path == "-" else res.path
    print(
        f"wrote {where}: {res.name}/, {len(res.collected)} files, "
        f"{len(res.missing)} missing (listed in {res.name}/umbp-sim-collect.json)",
        file=sys.stderr,
    )
    return 0


def _collect_pid(args: argparse.Namespace) -> int:
    """--pid: the stand-alone collector does it (one implementation of what a server saw)."""
    from importlib import resources

    script = resources.files("umbp_sim.collect_scripts").joinpath("standalone_collect.py")
    argv = ["-o", args.output, "--pid", str(args.pid)]
    if args.name:
        argv += ["--name", args.name]
    with resources.as_file(script) as path:
        with subprocess.Popen(
            [sys.executable, "-I", "-S", str(path), *argv], stderr=subprocess.PIPE, text=True
        ) as proc:
            assert proc.stderr is not None
            # Its messages as this command's own, as they come: named umbp-sim collect, no
            # script usage line.
            for line in proc.stderr:
                if not line.startswith("usage: "):
                    line = re.sub(r"^collect\.py: ", "umbp-sim collect: ", line.rstrip("\n"))
                    print(line, file=sys.stderr, flush=True)
    return proc.returncode
