"""What ``umbp-sim exec`` tells about CMD before it runs it, from the file alone (nothing of it
runs): whether the interposer can reach it, whether a sanitizer runtime must be loaded before
the interposer, and the ``LD_PRELOAD`` it gets.

- A *static* program (an ELF file without a ``PT_INTERP``: no dynamic loader) loads no preloaded
  library: its calls are this box's. So is a program the loader runs in *secure mode* (a
  set-user-ID or set-group-ID file that changes the user or group, or one with file
  capabilities): the loader ignores a preloaded library named by its path. Either one would run
  on the real host: ``unreachable`` says which, and exec refuses it unless ``--allow-real-host``.
- A program linked with a sanitizer runtime as a shared library (``DT_NEEDED`` libasan,
  libtsan, libhwasan, or clang's ``libclang_rt.asan...``) refuses to start unless that runtime
  is the first object loaded ("ASan runtime does not come first in initial library list"): its
  name goes first in ``LD_PRELOAD`` (the loader searches it as it would the program's own
  dependency), the interposer after it, whose calls the runtime then forwards to it
  (csrc/interposer/routing.cpp, ``find_forwarders``). A runtime linked into the program itself
  (clang's default) needs nothing: the program is searched before every preloaded object.
  AddressSanitizer's leak check at exit (LeakSanitizer) stops every thread and reads every
  readable mapping: the simulated host's trapped ones with it, and it crashes ("Tracer caught
  signal 11"), the program's exit status lost. ``leak_check_off`` adds ``detect_leaks=0`` to
  ``ASAN_OPTIONS`` unless it says otherwise; the report says so.
- A script's ``#!`` interpreter is what runs: it is looked at in its place.

``preload_list`` orders ``LD_PRELOAD``: sanitizer runtimes, then the interposer, then what the
user preloaded already (a library loaded before the interposer would hide the C library's calls
from it, or be found before the C library by its look-ups: ``LD_PRELOAD=libc.so.6`` was a
SIGSEGV).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import struct
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import BinaryIO, TypeVar

MAX_SCRIPT_DEPTH = 4  # as the kernel's binfmt_script recursion
_READ_LIMIT = 1 << 20  # bytes read of any one ELF structure: a file claiming more is not looked at
_SANITIZERS = re.compile(r"^lib(asan|tsan|hwasan|clang_rt\.(asan|tsan|hwasan)[^/]*)\.so")
# Every sanitizer runtime the interposer treats as a forwarder (routing.cpp): one in the
# user's LD_PRELOAD stays before the interposer.
_PRELOAD_FIRST = re.compile(r"^lib(asan|tsan|hwasan|ubsan|lsan|clang_rt\.)")

PT_INTERP, PT_DYNAMIC, PT_LOAD = 3, 2, 1
DT_NULL, DT_NEEDED, DT_STRTAB = 0, 1, 5


@dataclass(frozen=True)
class Program:
    """What CMD is: its file, why the interposer cannot reach it (None: it can), and the
    sanitizer runtimes it needs loaded first (their names as in its ``DT_NEEDED``)."""

    path: str
    unreachable: str | None = None
    sanitizers: tuple[str, ...] = ()


def resolve(name: str, env: dict[str, str]) -> str | None:
    """The file ``name`` runs (as execvp finds it with ``env``'s PATH); None: not found."""
    if "/" in name:
        return name if os.path.exists(name) else None
    return shutil.which(name, path=env.get("PATH", os.defpath))


def inspect(name: str, env: dict[str, str]) -> Program | None:
    """What the interposer will find in CMD ``name``; None when it is not a file (Popen says
    why) or not one this can read (it runs, and its record says what happened)."""
    path = resolve(name, env)
    if path is None:
        return None
    for _ in range(MAX_SCRIPT_DEPTH):
        try:
            st = os.stat(path)
            if not stat.S_ISREG(st.st_mode):
                return None
            secure = _secure_mode(path, st)
            if secure is not None:
                return Program(path, unreachable=secure)
            with open(path, "rb") as f:
                head = f.read(256)
                if head.startswith(b"#!"):
                    interpreter = head[2:].split(b"\n", 1)[0].split()
                    if not interpreter:
                        return None
                    path = os.fsdecode(interpreter[0])
                    continue
                if not head.startswith(b"\x7fELF"):
                    return None
                return _elf(path, f, head)
        except (OSError, ValueError, struct.error):
            return None
    return None


def _secure_mode(path: str, st: os.stat_result) -> str | None:
    """Why the loader would run ``path`` in secure mode (ignoring LD_PRELOAD), or None."""
    try:
        if os.statvfs(path).f_flag & os.ST_NOSUID:
            return None  # the bits change nobody's id there
    except OSError:
        pass
    if st.st_mode & stat.S_ISUID and st.st_uid != os.getuid():
        return f"a set-user-ID program (owner uid {st.st_uid})"
    if st.st_mode & stat.S_ISGID and st.st_gid != os.getgid():
        return f"a set-group-ID program (group gid {st.st_gid})"
    try:
        os.getxattr(path, "security.capability")
        return "a program with file capabilities"
    except OSError:
        return None


def _elf(path: str, f: BinaryIO, head: bytes) -> Program | None:
    """An ELF file's PT_INTERP (none: static) and the sanitizer runtimes among its DT_NEEDED."""
    bits, order = head[4], head[5]
    if bits not in (1, 2) or order not in (1, 2):
        return None
    end = "<" if order == 1 else ">"
    wide = bits == 2
    if wide:
        phoff, phentsize, phnum = struct.unpack_from(end + "32xQ14xHH", head)
        phdr_fmt = end + "IIQQQQQQ"  # type, flags, offset, vaddr, paddr, filesz, memsz, align
    else:
        phoff, phentsize, phnum = struct.unpack_from(end + "28xI10xHH", head)
        phdr_fmt = end + "IIIIIIII"  # type, offset, vaddr, paddr, filesz, memsz, flags, align
    if phentsize < struct.calcsize(phdr_fmt) or phentsize * phnum > _READ_LIMIT:
        return None
    table = _read(f, phoff, phentsize * phnum)
    segments = []  # (type, offset, vaddr, filesz)
    for i in range(phnum):
        fields = struct.unpack_from(phdr_fmt, table, i * phentsize)
        if wide:
            segments.append((fields[0], fields[2], fields[3], fields[5]))
        else:
            segments.append((fields[0], fields[1], fields[2], fields[4]))
    if not any(s[0] == PT_INTERP for s in segments):
        return Program(path, unreachable="a static program (no dynamic loader to preload into)")
    dynamic = [s for s in segments if s[0] == PT_DYNAMIC]
    if not dynamic or dynamic[0][3] > _READ_LIMIT:
        return Program(path)
    data = _read(f, dynamic[0][1], dynamic[0][3])
    entry = end + ("qQ" if wide else "iI")
    size = struct.calcsize(entry)
    needed, strtab = [], None
    for off in range(0, len(data) - size + 1, size):
        tag, value = struct.unpack_from(entry, data, off)
        if tag == DT_NULL:
            break
        if tag == DT_NEEDED:
            needed.append(value)
        elif tag == DT_STRTAB:
            strtab = value
    if strtab is None:
        return Program(path)
    base = _file_offset(segments, strtab)
    if base is None:
        return Program(path)
    names = []
    for at in needed:
        raw = _read(f, base + at, 256).split(b"\0", 1)[0]
        name = os.fsdecode(raw)
        if _SANITIZERS.match(name):
            names.append(name)
    return Program(path, sanitizers=tuple(names))


def _file_offset(segments: list[tuple[int, int, int, int]], vaddr: int) -> int | None:
    for kind, offset, start, filesz in segments:
        if kind == PT_LOAD and start <= vaddr < start + filesz:
            return offset + (vaddr - start)
    return None


def _read(f: BinaryIO, offset: int, n: int) -> bytes:
    f.seek(offset)
    return f.read(n)


def preload_list(existing: str, interposer: str, first: tuple[str, ...] = ()) -> str:
    """``LD_PRELOAD`` for a process the interposer goes into: the sanitizer runtimes (those
    ``existing`` names, then ``first``, each once), the interposer, then the rest of
    ``existing`` in its order. Names split on spaces and colons, as the loader splits them."""
    names = [n for n in re.split(r"[ :]+", existing) if n and n != interposer]
    runtimes = [n for n in names if _PRELOAD_FIRST.match(os.path.basename(n))] + list(first)
    seen: set[str] = set()
    ordered = []
    for n in runtimes:
        if os.path.basename(n) not in seen:
            seen.add(os.path.basename(n))
            ordered.append(n)
    rest = [n for n in names if not _PRELOAD_FIRST.match(os.path.basename(n))]
    return " ".join([*ordered, interposer, *rest])


def leak_check_off(env: dict[str, str], sanitizers: tuple[str, ...]) -> bool:
    """Add ``detect_leaks=0`` to ``env``'s ASAN_OPTIONS for a program with AddressSanitizer's
    runtime, unless its options name detect_leaks; whether it did."""
    if not any(re.match(r"^lib(asan|clang_rt\.asan)", name) for name in sanitizers):
        return False
    options = env.get("ASAN_OPTIONS", "")
    if "detect_leaks" in options:
        return False
    env["ASAN_OPTIONS"] = f"{options}:detect_leaks=0" if options else "detect_leaks=0"
    return True


EXEC_ENV = "UMBP_SIM_EXEC"  # the private directory
EVIDENCE_ENV = "UMBP_SIM_EXEC_EVIDENCE"  # fd:dev:ino of the evidence pipe


_Env = TypeVar("_Env", bound=MutableMapping[str, str])


def leave_exec(env: _Env) -> _Env:
    """``env`` without an exec run's variables. A process that is not a program under exec (an
    allocator's server, a new exec run) must not inherit them: the interposer it loads would
    start that host in it (a stray ``UMBP_SIM_EXEC`` made every external allocator "could not
    run") and write its evidence on that run's pipe."""
    for name in (EXEC_ENV, EVIDENCE_ENV):
        env.pop(name, None)
    return env
