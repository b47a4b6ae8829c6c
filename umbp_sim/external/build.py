"""``umbp-sim build-allocator``: compile allocator sources against the interposer (link time).

The objects are linked with ``-Wl,--wrap=SYMBOL`` for every call the interposer routes, and
against ``libumbp_sim_interpose.so`` (which defines ``__wrap_SYMBOL``), with libstdc++ linked
statically so that ``std::ifstream``'s opens are the build's own (wrapped) calls too. The result
is a shared object; with a pybind11 (or any CPython) module in the sources it is importable and
runs as ``--allocator PATH``. Python's and pybind11's include directories are added when present.
It carries debug info (``-g``), so that compare can name the source line of each call it shows
(``umbp_sim.external.call_sites``); ``--link-arg -g0`` (last on the line) builds without it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sysconfig
from collections.abc import Sequence
from pathlib import Path

from umbp_sim.capi import get_include, interposer_path
from umbp_sim.errors import UmbpSimError
from umbp_sim.exit_codes import EX_DATAERR

WRAPPED = (
    "mmap", "mmap64", "munmap", "madvise", "mbind", "syscall", "memfd_create", "ftruncate",
    "ftruncate64", "close", "sysconf", "open", "open64", "openat", "openat64", "__open_2",
    "__open64_2", "__openat_2", "fopen", "fopen64",
)  # fmt: skip


class BuildError(UmbpSimError):
    exit_code = EX_DATAERR
    multiline = True  # the compiler's output follows the first line


def compiler_env() -> dict[str, str]:
    """This environment without preloaded libraries (a sanitizer runtime preloaded into the
    compiler reports the compiler's own leaks and fails the build)."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    return env


def include_dirs() -> list[str]:
    dirs = [get_include(), sysconfig.get_paths()["include"]]
    try:
        import pybind11

        dirs.append(pybind11.get_include())
    except ImportError:
        pass
    return dirs


def compile_command(
    sources: Sequence[str],
    output: str,
    includes: Sequence[str] = (),
    defines: Sequence[str] = (),
    extra: Sequence[str] = (),
    cxx: str | None = None,
) -> list[str]:
    """The compiler command line ``build_allocator`` runs."""
    compiler = cxx or os.environ.get("CXX") or "c++"
    interposer = interposer_path()
    cmd = [compiler, "-std=c++17", "-O2", "-g", "-fPIC", "-shared", "-static-libstdc++",
           "-static-libgcc"]  # fmt: skip
    cmd += [f"-I{d}" for d in [*includes, *include_dirs()]]
    cmd += [f"-D{d}" for d in defines]
    cmd += list(sources)
    cmd += [f"-Wl,--wrap={s}" for s in WRAPPED]
    cmd += [interposer, f"-Wl,-rpath,{os.path.dirname(interposer)}"]
    cmd += list(extra)
    cmd += ["-o", output]
    return cmd


def build_allocator(
    sources: Sequence[str],
    output: str,
    includes: Sequence[str] = (),
    defines: Sequence[str] = (),
    extra: Sequence[str] = (),
    cxx: str | None = None,
) -> list[str]:
    """Compile and link; BuildError (one line, then the compiler's output) on failure."""
    for s in sources:
        if not Path(s).is_file():
            raise BuildError(f"{s}: no such source file")
    for d in includes:
        if not Path(d).is_dir():
            raise BuildError(f"-I {d}: no such directory")
    cmd = compile_command(sources, output, includes, defines, extra, cxx)
    if shutil.which(cmd[0]) is None:
        raise BuildError(f"{cmd[0]}: compiler not found (set CXX)")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=compiler_env())
    if proc.returncode != 0:
        out = (proc.stderr or proc.stdout).strip()
        raise BuildError(f"compiling {output} failed:\n{shlex.join(cmd)}\n{out}")
    return cmd
