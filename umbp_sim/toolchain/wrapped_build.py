"""``umbp-sim build-allocator``: compile allocator sources against the interposer (link time).

The objects are linked with ``-Wl,--wrap=SYMBOL`` for every call the interposer routes, and
against ``libumbp_sim_interpose.so`` (which defines ``__wrap_SYMBOL``), with libstdc++ linked
statically so that ``std::ifstream``'s opens are the build's own (wrapped) calls too. The result
is a shared object; with a pybind11 (or any CPython) module in the sources it is importable and
runs as ``--allocator PATH``. Python's and pybind11's include directories are added when present.
It carries debug info (``-g``), so that compare can name the source line of each call it shows
(``umbp_sim.comparison.call_sites``); ``--link-arg -g0`` (last on the line) builds without it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import stat
import sysconfig
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from umbp_sim.capi import get_include, interposer_path
from umbp_sim.errors import UmbpSimError
from umbp_sim.toolchain.compiler import BuildLimits, Compiled, CompilerTimeout, run_compiler
from umbp_sim.vocabulary.bounded import shown
from umbp_sim.vocabulary.exit_codes import EX_DATAERR
from umbp_sim.vocabulary.units import format_size, size_at_most

WRAPPED = (
    "mmap", "mmap64", "munmap", "madvise", "mbind", "syscall", "memfd_create", "ftruncate",
    "ftruncate64", "close", "sysconf", "open", "open64", "openat", "openat64", "__open_2",
    "__open64_2", "__openat_2", "fopen", "fopen64",
)  # fmt: skip


class BuildError(UmbpSimError):
    """A build refused or failed: one line (a path's control characters escaped)."""

    exit_code = EX_DATAERR


class CompileError(BuildError):
    """A compiler command failed: its first line, then the command and the compiler's output."""

    multiline = True


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


def named(path: str) -> str:
    """A path as a message names it: whole up to PATH_MAX, bounded past it."""
    return path if len(path) <= 4096 else shown(path)


def regular_file(path: str, what: str, max_size: int | None = None) -> int:
    """The size of ``path``, a regular file (links followed) of at most ``max_size`` bytes; a
    one-line BuildError naming it (``what``: how the command line or checkout named it)
    otherwise. A FIFO, a device or a directory is never opened."""
    what = named(what)
    try:
        st = os.stat(path)
    except OSError as e:
        raise BuildError(f"{what}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = next((w for test, w in _KINDS if test(st.st_mode)), "not a regular file")
        raise BuildError(f"{what}: {kind}, not a regular file")
    if max_size is not None and st.st_size > max_size:
        raise BuildError(
            f"{what}: {st.st_size:,} bytes, more than a source file (at most {max_size:,})"
        )
    return st.st_size


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)
MAX_READ = 16 << 20  # bytes of a header umbp-sim reads itself (mori's logging header: 2 KiB)


def read_header(path: str, what: str) -> str:
    """The text of a header umbp-sim reads itself: a regular file of at most MAX_READ bytes
    (``regular_file``), read no further than that whatever it grows to meanwhile."""
    regular_file(path, what, MAX_READ)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as e:
        raise BuildError(f"{what}: {e.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped after the check
            raise BuildError(f"{what}: not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_READ + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_READ:
        raise BuildError(f"{what}: more than {MAX_READ:,} bytes, more than a source file")
    return data.decode(errors="replace")


def build_allocator(
    sources: Sequence[str],
    output: str,
    includes: Sequence[str] = (),
    defines: Sequence[str] = (),
    extra: Sequence[str] = (),
    cxx: str | None = None,
    limits: BuildLimits | None = None,
    check: Callable[[str], None] | None = None,
) -> list[str]:
    """Compile and link into ``output``, bounded (``umbp_sim.toolchain.compiler``); BuildError
    (one line, then the compiler's output) on failure. ``output`` is checked before anything
    is compiled (OutputFileError, exit 73) and written atomically: the compiler writes a file of
    the same name in a fresh directory beside it, ``check`` (build-allocator: the module loads)
    is given that file, and only then is it moved into place; the directory is removed
    whatever happens (by the keeper, should umbp-sim be killed)."""
    from umbp_sim.vocabulary.output_file import OutputFile, OutputFileError

    for s in sources:
        if not os.path.lexists(s):
            raise BuildError(f"{named(s)}: no such source file")
        regular_file(s, s)
    for d in includes:
        if not Path(d).is_dir():
            raise BuildError(f"-I {named(d)}: no such directory")
    shown_cmd = compile_command(sources, output, includes, defines, extra, cxx)
    if shutil.which(shown_cmd[0]) is None:
        raise BuildError(f"{named(shown_cmd[0])}: compiler not found (set CXX)")
    target = OutputFile(output, "-o", dash=False)
    limits = limits or BuildLimits()
    try:
        work = tempfile.mkdtemp(prefix=f".{os.path.basename(output)}.", dir=_directory(output))
    except OSError as e:
        raise OutputFileError(f"-o {output}: cannot write: {e.strerror}") from None
    try:
        staged = os.path.join(work, os.path.basename(output))
        cmd = compile_command(sources, staged, includes, defines, extra, cxx)
        compiled = _compile(cmd, limits, f"compiling {output}", work)
        if compiled.returncode != 0:
            raise CompileError(
                f"{_failed(f'compiling {output}', compiled, limits)}:\n{shlex.join(shown_cmd)}\n"
                f"{compiled.output.strip()}"
            )
        if check is not None:
            check(staged)
        target.place(staged)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return shown_cmd


def _directory(output: str) -> str:
    return os.path.dirname(output) or "."


def _compile(cmd: list[str], limits: BuildLimits, stage: str, work: str | None) -> Compiled:
    """``cmd`` run bounded; a one-line BuildError naming ``stage`` past --build-timeout."""
    try:
        return run_compiler(cmd, compiler_env(), limits, remove=work)
    except CompilerTimeout:
        raise BuildError(
            f"{stage}: the compiler did not end within {limits.timeout:g} s and was ended "
            "(--build-timeout; an #include of a FIFO or a device?)"
        ) from None


def _failed(stage: str, compiled: Compiled, limits: BuildLimits) -> str:
    """The first line of a failed compiler command: the stage, and the limit it ran into when
    its largest process came near --build-memory or it was killed by a limit's signal."""
    if compiled.near_memory_limit(limits):
        return (
            f"{stage} failed: the compiler reached {size_at_most(compiled.peak_rss, 1)[0]} of its "
            f"{format_size(limits.memory)} of memory (--build-memory; an #include of a device "
            "such as /dev/zero?)"
        )
    if compiled.returncode == -signal.SIGXFSZ:
        return f"{stage} failed: the compiler wrote a file past {format_size(limits.file_size)}"
    if compiled.returncode == -signal.SIGXCPU:
        return f"{stage} failed: the compiler used {limits.timeout:g} s of CPU (--build-timeout)"
    return f"{stage} failed"
