"""Test builds (the test allocator, the C ABI probe) compiled once and reused while their inputs
are unchanged: across xdist workers and across test runs.

A build is keyed by a hash of everything that decides its bytes: the command line (with the
output path left out), the compiler's version, the content of every file the command names (the
sources, the interposer library it links against) and of every file under the project's own
include directory and of the trees a caller names as inputs (headers the command finds through
-I), and the versions of Python and pybind11 whose headers it may include. The
result lives in ``$UMBP_SIM_TEST_BUILD_CACHE`` (default ``~/.cache/umbp-sim/test-builds``); a
file lock per key makes concurrent workers wait for one compiler instead of running several,
and a finished build is moved into place whole, so a killed compile leaves nothing behind.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from functools import cache
from pathlib import Path

from umbp_sim.capi import get_include
from umbp_sim.toolchain.wrapped_build import compiler_env


def cache_dir() -> Path:
    configured = os.environ.get("UMBP_SIM_TEST_BUILD_CACHE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "umbp-sim" / "test-builds"


@cache
def _compiler_version(compiler: str) -> bytes:
    proc = subprocess.run([compiler, "--version"], capture_output=True, env=compiler_env())
    return proc.stdout + proc.stderr


def _pybind11_version() -> str:
    try:
        import pybind11

        return str(pybind11.__version__)
    except ImportError:
        return "none"


def build_key(cmd: Sequence[str], output: str, inputs: Sequence[Path] = ()) -> str:
    """The hash of what decides the bytes ``cmd`` writes to ``output`` (``inputs``: directories
    whose every file counts too)."""
    h = hashlib.sha256()

    def add(label: str, data: bytes) -> None:
        h.update(f"{label}:{len(data)}:".encode())
        h.update(data)

    add("compiler", _compiler_version(cmd[0]))
    add("python", sys.version.encode())
    add("pybind11", _pybind11_version().encode())
    for arg in cmd:
        if arg == output:
            add("arg", b"<output>")
            continue
        add("arg", arg.encode())
        path = Path(arg)
        if path.is_file():
            add("file", path.read_bytes())
    for label, tree in [("include", Path(get_include())), *(("input", Path(d)) for d in inputs)]:
        for f in sorted(tree.rglob("*")):
            if f.is_file():
                add(f"{label} {f.relative_to(tree)}", f.read_bytes())
    return h.hexdigest()[:32]


def cached_build(cmd: Sequence[str], output: str, inputs: Sequence[Path] = ()) -> str:
    """Run ``cmd`` (which writes ``output``) unless a build with the same key is cached; the
    path of the cached result (named as ``output``'s basename), which callers use instead of
    ``output``. A failing compiler fails the test with its output."""
    key = build_key(cmd, output, inputs)
    d = cache_dir() / key
    d.mkdir(parents=True, exist_ok=True)
    target = d / Path(output).name
    with open(d / ".lock", "w") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        if target.exists():
            return str(target)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".build-", suffix=Path(output).suffix)
        os.close(fd)
        try:
            argv = [tmp if a == output else a for a in cmd]
            proc = subprocess.run(argv, capture_output=True, text=True, env=compiler_env())
            assert proc.returncode == 0, f"{' '.join(argv)}\n{proc.stderr}"
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return str(target)


def cached_builds(
    jobs: dict[str, tuple[Sequence[str], str]], inputs: Sequence[Path] = ()
) -> dict[str, str]:
    """Several builds, compiled side by side where not cached: {name: (cmd, output)} ->
    {name: path} (``inputs`` as ``build_key`` takes them, for every job)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
        futures = {
            name: pool.submit(cached_build, cmd, out, inputs) for name, (cmd, out) in jobs.items()
        }
        return {name: f.result() for name, f in futures.items()}
