"""A call site of an external build (object path, offset: the interposer's record of where a
routed call came from) as a source location, read from the build's debug info.

The offset is the call's return address minus one, less the object's load base (dladdr's
``dli_fbase``); addr2line wants it as an address of the ELF file, so the first loadable
segment's address is added (0 for a shared object, the link address of an executable that is
not position-independent). addr2line (binutils) is run once per object for all of its sites,
bounded by ``ADDR2LINE_TIMEOUT``; its output is its documented two lines per address, the
function then ``FILE:LINE`` (``??`` when unknown). An object without DWARF (``.debug_info``)
says so: "no debug info in PATH: build with -g".
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from collections.abc import Iterable
from typing import Any

ADDR2LINE_TIMEOUT = 10.0  # seconds for one object's sites
MAX_PATH = 4096  # an object path longer than this is not looked at
MAX_OBJECTS = 4  # objects read in one locate (a run's record is the allocator process's data)
_CACHE_KEPT = 4096
_cache: dict[tuple[str, int], dict[str, Any]] = {}

PT_LOAD = 1


class _NotElf(Exception):
    pass


def _elf_facts(path: str) -> tuple[int, bool]:
    """(the first PT_LOAD segment's page-aligned address, whether a .debug_info section is
    there) of the ELF file at ``path``; _NotElf (its text says why) when it is not one."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2:
                raise _NotElf("not a 64-bit ELF file")
            end = "<" if head[5] == 1 else ">"
            phoff, shoff = struct.unpack_from(end + "QQ", head, 32)
            phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from(
                end + "HHHHH", head, 54
            )
            base = 0
            for i in range(min(phnum, 256)):
                f.seek(phoff + i * phentsize)
                ph = f.read(56)
                if len(ph) == 56 and struct.unpack_from(end + "I", ph, 0)[0] == PT_LOAD:
                    base = struct.unpack_from(end + "Q", ph, 16)[0] & ~0xFFF
                    break
            names: list[int] = []
            strtab = (0, 0)
            for i in range(min(shnum, 65536)):
                f.seek(shoff + i * shentsize)
                sh = f.read(64)
                if len(sh) < 64:
                    break
                names.append(struct.unpack_from(end + "I", sh, 0)[0])
                if i == shstrndx:
                    strtab = struct.unpack_from(end + "QQ", sh, 24)
            f.seek(strtab[0])
            table = f.read(min(strtab[1], 1 << 20))
    except OSError as e:
        raise _NotElf(e.strerror or str(e)) from None
    debug = any(table[n : n + 12] == b".debug_info\0" for n in names)
    return base, debug


def _addr2line(path: str, addresses: list[int]) -> list[tuple[str, str]] | str:
    """(function, FILE:LINE) per address, or why there are none (one line)."""
    tool = shutil.which("addr2line")
    if tool is None:
        return "addr2line not found (install binutils): no source lines"
    cmd = [tool, "-f", "-C", "-e", path, *(f"{a:#x}" for a in addresses)]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, errors="replace", timeout=ADDR2LINE_TIMEOUT,
            # nothing preloaded into it: a sanitizer runtime would report addr2line's own leaks
            env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"},
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"addr2line took over {ADDR2LINE_TIMEOUT:g} s on {path}"
    except OSError as e:
        return f"addr2line could not run: {e.strerror or e}"
    lines = proc.stdout.splitlines()
    if proc.returncode != 0 or len(lines) != 2 * len(addresses):
        return f"addr2line could not read {path}"
    return [(lines[2 * i], lines[2 * i + 1]) for i in range(len(addresses))]


def _location(path: str, offset: int, function: str, where: str, debug: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"object": path, "offset": offset}
    file, _, line = where.partition(" ")[0].rpartition(":")
    if file and file != "??" and line.isdigit() and int(line) > 0:
        out.update(file=file, line=int(line))
        if function != "??":
            out["function"] = function
    elif not debug:
        out["note"] = f"no debug info in {path}: build with -g"
    else:
        out["note"] = f"no source line for offset {offset:#x} in {path}"
    return out


def locate(sites: Iterable[tuple[str, int]]) -> dict[tuple[str, int], dict[str, Any]]:
    """Each (object path, offset) as ``{"object", "offset", "file", "line", "function"}`` or
    ``{"object", "offset", "note"}`` (why there is no line), addr2line run once per object, for
    at most ``MAX_OBJECTS`` objects (those past them: "not looked up")."""
    wanted = {(str(p), int(o)) for p, o in sites}
    out = {s: _cache[s] for s in wanted if s in _cache}
    by_object: dict[str, list[int]] = {}
    for path, offset in wanted - set(out):
        by_object.setdefault(path, []).append(offset)
    for n, (path, offsets) in enumerate(sorted(by_object.items())):
        offsets.sort()
        if n >= MAX_OBJECTS:
            for o in offsets:
                out[(path, o)] = {"object": path, "offset": o, "note": "not looked up"}
            continue
        found = _object_sites(path, offsets)
        for offset, loc in zip(offsets, found, strict=True):
            out[(path, offset)] = loc
            if len(_cache) < _CACHE_KEPT:
                _cache[(path, offset)] = loc
    return out


def _object_sites(path: str, offsets: list[int]) -> list[dict[str, Any]]:
    def noted(text: str) -> list[dict[str, Any]]:
        return [{"object": path, "offset": o, "note": text} for o in offsets]

    if not os.path.isabs(path) or len(path) > MAX_PATH or not os.path.isfile(path):
        return noted(f"{path}: no such file here (the build moved?)")
    try:
        base, debug = _elf_facts(path)
    except _NotElf as e:
        return noted(f"{path}: {e}")
    found = _addr2line(path, [base + o for o in offsets])
    if isinstance(found, str):
        return noted(found if debug else f"no debug info in {path}: build with -g")
    return [_location(path, o, fn, w, debug) for o, (fn, w) in zip(offsets, found, strict=True)]


def site_text(loc: dict[str, Any] | None) -> str:
    """A location in a few words: ``/src/a.cpp:130 (alloc)``, its note, or ""."""
    if not loc:
        return ""
    if "file" not in loc:
        return str(loc.get("note", ""))
    fn = f" ({loc['function']})" if loc.get("function") else ""
    return f"{loc['file']}:{loc['line']}{fn}"
