"""``umbp-sim build-allocator --mori CHECKOUT -o OUT``: mori's allocator in one command.

A mori checkout's ``src/umbp/local/host_mem_allocator.cpp`` is compiled with umbp-sim's own
binding of its public header (``umbp_sim/bindings/mori_umbp_pybind.cpp``: the Python surface
mori's pybind module gives the allocator), against the interposer, into an importable module
named after OUT's stem. mori logs through spdlog (``include/mori/utils/mori_log.hpp``): its
headers are looked up with the compiler, and what the installed spdlog needs at link time (an
external fmt: ``-lfmt``; a compiled spdlog: ``-lspdlog``) is read from its configuration
macros. ``check_loads`` then loads the result in a child process, so "built" is only said of a
module that imports.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from umbp_sim.toolchain.compiler import BuildLimits, CompilerTimeout, run_compiler
from umbp_sim.toolchain.wrapped_build import (
    BuildError,
    compiler_env,
    include_dirs,
    named,
    read_header,
    regular_file,
)
from umbp_sim.vocabulary.exit_codes import EX_CANTCREAT

SOURCE = "src/umbp/local/host_mem_allocator.cpp"
HEADER = "src/umbp/include/umbp/local/host_mem_allocator.h"
INCLUDES = ("src/umbp/include", "include")
LOG_INCLUDE = "mori/utils/mori_log.hpp"
LOG_HEADER = f"include/{LOG_INCLUDE}"
API_HEADER = "umbp/local/host_mem_allocator.h"  # as the binding includes it
SPDLOG_HEADER = "spdlog/spdlog.h"
SPDLOG_PACKAGES = "apt-get install libspdlog-dev (Debian, Ubuntu) or dnf install spdlog-devel"


@dataclass
class MoriBuild:
    """What ``build_allocator`` is given for a mori checkout."""

    sources: list[str]
    includes: list[str]
    defines: list[str]
    extra: list[str] = field(default_factory=list)


def binding_source() -> str:
    """umbp-sim's binding of mori's allocator header (shipped in the package)."""
    return str(resources.files("umbp_sim.bindings").joinpath("mori_umbp_pybind.cpp"))


def module_name(output: str) -> str:
    """The Python module name OUT's file name gives (``mori_umbp.so``, ``x.cpython-311-...so``)."""
    name = Path(output).name.split(".")[0]
    if not name.isidentifier():
        raise BuildError(
            f"-o {output}: {name!r} is not a Python module name (name it like mori_umbp.so)"
        )
    return name


def mori_build(
    checkout: str, output: str, cxx: str | None = None, limits: BuildLimits | None = None
) -> MoriBuild:
    """The sources, include directories, defines and link arguments of a mori checkout."""
    root = Path(checkout)
    checkout = named(checkout)
    if not root.is_dir():
        raise BuildError(f"--mori {checkout}: no such directory")
    for rel in (SOURCE, HEADER):
        if not os.path.lexists(root / rel):
            raise BuildError(f"--mori {checkout}: not a mori checkout (no {rel})")
        regular_file(str(root / rel), f"--mori {checkout}: {rel}")
    includes = [str(root / d) for d in INCLUDES if (root / d).is_dir()]
    return mori_api_build([str(root / SOURCE)], includes, output, cxx, limits)


def mori_api_build(
    sources: list[str],
    includes: list[str],
    output: str,
    cxx: str | None = None,
    limits: BuildLimits | None = None,
) -> MoriBuild:
    """An allocator with mori's ``HostMemAllocator`` API, wherever its files are: ``sources``
    and umbp-sim's binding, compiled against the header found as ``umbp/local/
    host_mem_allocator.h`` in ``includes`` (a BuildError naming it when none holds it); spdlog
    linked as it was built when an include directory holds mori's logging header."""
    if not any((Path(d) / API_HEADER).is_file() for d in includes):
        shown = ", ".join(named(d) for d in includes) or "none given"
        raise BuildError(
            f"--mori-binding: no -I directory holds {API_HEADER} (mori's allocator header; "
            f"-I: {shown})"
        )
    defines = [f"UMBP_SIM_MODULE_NAME={module_name(output)}"]
    extra: list[str] = []
    for d in includes:
        log_header = Path(d) / LOG_INCLUDE
        if os.path.lexists(log_header) and "spdlog" in read_header(
            str(log_header), str(log_header)
        ):
            extra = spdlog_link_args(cxx or os.environ.get("CXX") or "c++", includes, limits)
            break
    return MoriBuild([*sources, binding_source()], list(includes), defines, extra)


def spdlog_link_args(cxx: str, includes: list[str], limits: BuildLimits | None = None) -> list[str]:
    """What the installed spdlog needs at link time, from its configuration macros; a
    BuildError naming the packages that bring it when its headers are not found."""
    macros = _preprocess_macros(cxx, f"#include <{SPDLOG_HEADER}>\n", includes, limits)
    if macros is None:
        raise BuildError(
            f"mori logs through spdlog ({LOG_HEADER}) and the compiler finds no {SPDLOG_HEADER}: "
            f"{SPDLOG_PACKAGES}; or -I the directory holding spdlog/"
        )
    args = []
    if re.search(r"^#define SPDLOG_COMPILED_LIB\b", macros, re.M):
        args.append("-lspdlog")
    if re.search(r"^#define SPDLOG_FMT_EXTERNAL\b", macros, re.M):
        args.append("-lfmt")
    return args


def _preprocess_macros(
    cxx: str, text: str, includes: list[str], limits: BuildLimits | None = None
) -> str | None:
    """The macros defined after preprocessing ``text`` (``-dM -E``), None when it fails. The
    compiler runs bounded (``umbp_sim.toolchain.compiler``), ``text`` a file of its own."""
    if shutil.which(cxx) is None:
        raise BuildError(f"{named(cxx)}: compiler not found (set CXX)")
    limits = limits or BuildLimits()
    with tempfile.TemporaryDirectory(prefix="umbp-sim-macros-") as work:
        source = os.path.join(work, "macros.cpp")
        with open(source, "w") as f:
            f.write(text)
        macros = os.path.join(work, "macros.h")
        cmd = [cxx, "-std=c++17", "-dM", "-E", source, "-o", macros]
        cmd += [f"-I{d}" for d in [*includes, *include_dirs()]]
        try:
            done = run_compiler(cmd, compiler_env(), limits, remove=work)
        except CompilerTimeout:
            raise BuildError(
                f"preprocessing {SPDLOG_HEADER}: the compiler did not end within "
                f"{limits.timeout:g} s and was ended (--build-timeout)"
            ) from None
        if done.returncode != 0:
            return None
        return read_header(macros, f"the macros of {SPDLOG_HEADER}")


def check_loads(output: str, path: str | None = None) -> None:
    """Load the built module as ``--allocator OUT`` does: the start of its allocator server
    (external/runner.py: its own process group, the run time limit, ended by any signal that
    ends this command); a BuildError saying why it does not load (an undefined symbol
    demangled, with the flag that brings it when known). ``path``: where the build is now (not
    yet moved to ``output``)."""
    from umbp_sim.allocator_spec import AllocatorSpec
    from umbp_sim.external.runner import CouldNotRun, ExternalRunner

    path = os.path.abspath(path or output)
    try:
        ExternalRunner(AllocatorSpec("shared-object", output, path)).close()
    except CouldNotRun as e:
        why = str(e).removeprefix(f"{output}: ")
        m = re.search(r"undefined symbol: ([\w.$@]+)", why)
        if m:
            symbol = _demangle(m.group(1))
            hint = ""
            if symbol.startswith("fmt::"):
                hint = " (spdlog on an external fmt: --link-arg=-lfmt)"
            elif symbol.startswith("spdlog::"):
                hint = " (a compiled spdlog: --link-arg=-lspdlog)"
            why = f"undefined symbol {symbol}{hint}"
        raise BuildError(f"{output} was built but does not load: {why}") from None


def _demangle(symbol: str) -> str:
    tool = shutil.which("c++filt")
    if tool is None:
        return symbol
    try:
        proc = subprocess.run([tool, symbol], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return symbol  # the mangled name still names it
    return (proc.stdout.strip() or symbol) if proc.returncode == 0 else symbol


def check_output_writable(output: str) -> None:
    """OUT can be written (exit 73 otherwise). Deprecated: ``build.build_allocator`` checks
    OUT itself, as every output file is checked (``umbp_sim.vocabulary.output_file.OutputFile``)."""
    path = Path(output)
    parent = path.parent if str(path.parent) else Path(".")
    problem = None
    if path.is_dir():
        problem = "is a directory"
    elif not parent.is_dir():
        problem = f"its directory {parent} does not exist"
    elif not os.access(parent, os.W_OK | os.X_OK):
        problem = f"its directory {parent} is not writable"
    elif path.exists() and not os.access(path, os.W_OK):
        problem = "is not writable"
    if problem is None:
        try:  # what access() cannot see: a read-only file system
            fd, probe = tempfile.mkstemp(dir=parent, prefix=".umbp-sim-probe-")
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            problem = f"cannot be created: {e.strerror}"
    if problem:
        raise OutputError(f"-o {output}: {problem}")


class OutputError(BuildError):
    exit_code = EX_CANTCREAT
    multiline = False
