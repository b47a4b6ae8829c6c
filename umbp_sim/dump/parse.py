"""Parsers for single /proc and /sys files, in the formats the kernel writes them.

Every function takes the file's text and ``where`` (how to name the file in an error) and raises
only ``DumpError`` (with the 1-based line number when one line is to blame). They are pure and
work on strings, so replay/preflight can reuse them on live files and the fuzz tests can call
them directly. Formats: docs/kernel-model.md section 7.

Values in kB are returned in **bytes**; page counts are returned as counts.
"""

from __future__ import annotations

import re

from umbp_sim.dump.dump_error import DumpError
from umbp_sim.dump.limits import MAX_RELEASE_PART
from umbp_sim.vocabulary.meminfo import meminfo_lines, split_lines
from umbp_sim.vocabulary.value_types import MAX_BYTES

# The kernel prints unsigned long; anything wider is a corrupt file, not a bigger machine.
MAX_VALUE = (1 << 64) - 1
_MAX_DIGITS = len(str(MAX_VALUE))  # 20: longer is refused before int() (which stops at 4300)
# Node ids: MAX_NUMNODES is at most 1 << CONFIG_NODES_SHIFT = 1024 (NODES_SHIFT <= 10).
MAX_NODES = 1024

# /proc/meminfo keys umbp-sim uses, and whether the value is "N kB" (True) or a page count.
MEMINFO_KB_KEYS = (
    "MemTotal",
    "MemFree",
    "MemAvailable",
    "CommitLimit",
    "Committed_AS",
    "SwapTotal",
    "SwapFree",
    "Hugepagesize",
    "Hugetlb",
    "HighTotal",  # only 32-bit kernels with CONFIG_HIGHMEM print it
    "Cached",
    "Shmem",
    "Active(file)",
    "Inactive(file)",
    "SReclaimable",
)
MEMINFO_COUNT_KEYS = ("HugePages_Total", "HugePages_Free", "HugePages_Rsvd", "HugePages_Surp")
NODE_MEMINFO_KB_KEYS = (
    "MemTotal",
    "MemFree",
    "MemUsed",
    "Active(file)",
    "Inactive(file)",
    "FilePages",  # the page cache on kernels whose node files lack the file LRU lines
    "Shmem",
    "SReclaimable",
)
NODE_MEMINFO_COUNT_KEYS = ("HugePages_Total", "HugePages_Free", "HugePages_Surp")

_KEY_RE = re.compile(r"[A-Za-z0-9_()]+", re.ASCII)  # the text before a meminfo line's ':'
_NODE_KEY_RE = re.compile(r"Node\s+(\d+)\s+([A-Za-z0-9_()]+)", re.ASCII)
_KB_RE = re.compile(r"^\s*(\d+)\s+kB\s*$", re.ASCII)
_COUNT_RE = re.compile(r"^\s*(\d+)\s*$", re.ASCII)
_INT_RE = re.compile(r"^\s*(\d+)\s*$", re.ASCII)
_RANGE_RE = re.compile(r"^(\d+)(?:-(\d+))?$", re.ASCII)
_HUGEPAGE_DIR_RE = re.compile(r"^hugepages-(\d+)kB$", re.ASCII)
_DIGITS = re.compile(r"[0-9]+").fullmatch  # str.isdigit() also accepts '²'
_CGROUP_HUGETLB_RE = re.compile(r"^hugetlb\.(\d+)(KB|MB|GB|TB)\.max$", re.ASCII)


def _number(raw: str, where: str, line: int, key: str) -> int:
    digits = raw.lstrip("0") or "0"
    if len(digits) > _MAX_DIGITS or int(digits) > MAX_VALUE:
        shown = raw if len(raw) <= 24 else f"{raw[:12]}...({len(raw)} digits)"
        raise DumpError(where, f"value {shown} for {key} does not fit in 64 bits", line)
    return int(digits)


# The kernel ends every line with "\n"; a last line without it is a truncated file but its
# content may still be whole, so it is parsed like the others.
_lines = split_lines


def _kv_value(key: str, value: str, where: str, line: int, kb_keys: tuple[str, ...]) -> int:
    if key in kb_keys:
        m = _KB_RE.match(value)
        if not m:
            raise DumpError(where, f"cannot read value {value.strip()[:60]!r} for {key}", line)
        kb = _number(m.group(1), where, line, key)
        if kb * 1024 >= MAX_BYTES:
            raise DumpError(
                where,
                f"{key} {kb} kB is beyond what umbp-sim simulates (below 2^62 bytes)",
                line,
            )
        return kb * 1024
    m = _COUNT_RE.match(value)
    if not m:
        raise DumpError(where, f"cannot read value {value.strip()[:60]!r} for {key}", line)
    return _number(m.group(1), where, line, key)


def parse_meminfo(
    text: str, where: str = "meminfo", lines: dict[str, int] | None = None
) -> dict[str, int]:
    """``/proc/meminfo`` -> {key: value} for the keys umbp-sim uses (kB keys in bytes).

    Unknown keys are tolerated (lines vary by version) but must still look like ``Key: value``;
    known keys must carry a number in the kernel's format. A duplicated known key is an error.
    Raises DumpError if MemTotal is missing. ``lines``, if given, receives each key's line number.
    """
    out: dict[str, int] = {}
    known = MEMINFO_KB_KEYS + MEMINFO_COUNT_KEYS
    for t in meminfo_lines(_lines(text)):
        if not t.has_colon or not _KEY_RE.fullmatch(t.key):
            raise DumpError(where, f"expected 'Key: value', got {t.raw.strip()[:60]!r}", t.lineno)
        if t.key not in known:
            continue
        if t.key in out:
            raise DumpError(where, f"{t.key} appears twice", t.lineno)
        out[t.key] = _kv_value(t.key, t.value, where, t.lineno, MEMINFO_KB_KEYS)
        if lines is not None:
            lines[t.key] = t.lineno
    if "MemTotal" not in out:
        raise DumpError(where, "no MemTotal line (not a meminfo file?)")
    return out


def parse_node_meminfo(text: str, node: int, where: str = "meminfo") -> dict[str, int]:
    """``/sys/devices/system/node/nodeN/meminfo`` -> {key: value} (kB keys in bytes).

    Every line must read ``Node N Key: value`` with N equal to ``node``.
    """
    out: dict[str, int] = {}
    known = NODE_MEMINFO_KB_KEYS + NODE_MEMINFO_COUNT_KEYS
    for t in meminfo_lines(_lines(text)):
        m = _NODE_KEY_RE.fullmatch(t.key) if t.has_colon else None
        if not m:
            raise DumpError(
                where, f"expected 'Node {node} Key: value', got {t.raw.strip()[:60]!r}", t.lineno
            )
        if len(m.group(1)) > 7 or int(m.group(1)) != node:
            raise DumpError(
                where, f"line is about node {m.group(1)}, file is node{node}'s", t.lineno
            )
        key = m.group(2)
        if key not in known:
            continue
        if key in out:
            raise DumpError(where, f"{key} appears twice", t.lineno)
        out[key] = _kv_value(key, t.value, where, t.lineno, NODE_MEMINFO_KB_KEYS)
    return out


def parse_int(text: str, where: str = "file") -> int:
    """A sysfs/sysctl file holding one unsigned number (``"%lu\\n"``)."""
    lines = _lines(text)
    if not lines or not lines[0].strip():
        raise DumpError(where, "empty file, expected a number", 1)
    if len(lines) > 1 and any(x.strip() for x in lines[1:]):
        raise DumpError(where, "expected one number, found more lines", 2)
    m = _INT_RE.match(lines[0])
    if not m:
        raise DumpError(where, f"cannot read number {lines[0].strip()[:60]!r}", 1)
    return _number(m.group(1), where, 1, "the value")


def parse_nodelist(text: str, where: str = "nodelist", limit: int = MAX_NODES) -> list[int]:
    """A ``%*pbl`` list such as ``0``, ``0-1``, ``0,2-3`` (an empty line is the empty list)."""
    lines = _lines(text)
    first = lines[0].strip() if lines else ""
    if len(lines) > 1 and any(x.strip() for x in lines[1:]):
        raise DumpError(where, "expected one line", 2)
    if not first:
        return []
    ids: set[int] = set()
    for part in first.split(","):
        m = _RANGE_RE.match(part.strip())
        if not m:
            raise DumpError(where, f"cannot read node list {first[:60]!r}", 1)
        if max(len(g) for g in m.groups(default="")) > 7:
            raise DumpError(where, f"id {part.strip()[:20]!r} is beyond the kernel's limit "
                            f"of {limit}", 1)  # fmt: skip
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if lo > hi:
            raise DumpError(where, f"range {part.strip()!r} runs backwards", 1)
        if hi >= limit:
            raise DumpError(where, f"id {hi} is beyond the kernel's limit of {limit}", 1)
        ids.update(range(lo, hi + 1))
    return sorted(ids)


def parse_cpulist(text: str, where: str = "cpulist") -> str:
    """A cpulist (``0-7,16-23``), checked for syntax and returned as written (may be empty)."""
    lines = _lines(text)
    first = lines[0].strip() if lines else ""
    if first:
        for part in first.split(","):
            if not _RANGE_RE.match(part.strip()):
                raise DumpError(where, f"cannot read cpu list {first[:60]!r}", 1)
    return first


def parse_distance(text: str, where: str = "distance") -> list[int]:
    """``nodeN/distance``: space-separated SLIT distances, one per possible node."""
    lines = _lines(text)
    first = lines[0] if lines else ""
    out = []
    for tok in first.split():
        if not _DIGITS(tok) or len(tok) > 5:
            raise DumpError(where, f"cannot read distance {tok[:20]!r}", 1)
        out.append(int(tok))
    if not out:
        raise DumpError(where, "empty distance list", 1)
    return out


def parse_limits(text: str, where: str = "limits") -> dict[str, tuple[int | None, int | None]]:
    """``/proc/PID/limits`` -> {limit name: (soft, hard)}; ``unlimited`` is None.

    The kernel prints ``"%-25s %-20s %-20s %-10s\\n"``: a 25-column name, then soft, hard and
    an optional unit. The header line (``Limit ...``) is skipped.
    """
    out: dict[str, tuple[int | None, int | None]] = {}
    lines = _lines(text)
    if not lines or not lines[0].startswith("Limit"):
        raise DumpError(where, "expected the header line 'Limit  Soft Limit  Hard Limit  Units'", 1)
    for n, raw in enumerate(lines[1:], 2):
        if not raw.strip():
            continue
        name = raw[:25].strip()
        fields = raw[25:].split()
        if not name.startswith("Max ") or len(fields) < 2:
            raise DumpError(where, f"cannot read limit line {raw.strip()[:60]!r}", n)
        values: list[int | None] = []
        for tok in fields[:2]:
            if tok == "unlimited":
                values.append(None)
            elif _DIGITS(tok):
                values.append(_number(tok, where, n, name))
            else:
                raise DumpError(where, f"cannot read value {tok[:30]!r} for {name}", n)
        out[name] = (values[0], values[1])
    return out


def parse_cgroup_max(text: str, where: str = "memory.max") -> int | None:
    """A cgroup v2 limit file (``memory.max``, ``hugetlb.2MB.max``): bytes, or None for ``max``."""
    lines = _lines(text)
    first = lines[0].strip() if lines else ""
    if first == "max":
        return None
    m = _INT_RE.match(first)
    if not m:
        raise DumpError(where, f"cannot read limit {first[:60]!r} (expected a number or 'max')", 1)
    return _number(m.group(1), where, 1, "the limit")


def parse_osrelease(text: str, where: str = "osrelease") -> str:
    """``/proc/sys/kernel/osrelease`` (``6.18.44-fc-v1045``), checked to start with X.Y."""
    first = (_lines(text) or [""])[0].strip()
    m = re.match(r"^([0-9]+)\.([0-9]+)(?:\.([0-9]+))?", first)
    if not m:
        raise DumpError(where, f"cannot read kernel release {first[:60]!r}", 1)
    _check_release(m, where)
    return first


def _check_release(m: re.Match[str], where: str) -> None:
    for part in m.groups():
        if part is not None and (len(part) > 5 or int(part) > MAX_RELEASE_PART):
            raise DumpError(
                where,
                f"kernel release {m.group(0)[:40]!r}: {part[:12]} is beyond any kernel "
                f"(each part at most {MAX_RELEASE_PART})",
                1,
            )


def parse_proc_version(text: str, where: str = "version") -> str:
    """The release out of ``/proc/version`` (``Linux version 3.10.0-1160... (...)``)."""
    m = re.match(r"^Linux version ([0-9]+\.[0-9]+\S*)", text)
    if not m:
        raise DumpError(where, "cannot find 'Linux version X.Y' in the first line", 1)
    parts = re.match(r"^([0-9]+)\.([0-9]+)(?:\.([0-9]+))?", m.group(1))
    assert parts is not None  # the pattern above starts the same way
    _check_release(parts, where)
    return m.group(1)


def hugepage_dir_size(name: str) -> int | None:
    """``hugepages-2048kB`` -> 2097152 bytes; None for any other name."""
    m = _HUGEPAGE_DIR_RE.match(name)
    if not m or len(m.group(1)) > 15:
        return None
    return int(m.group(1)) * 1024


def cgroup_hugetlb_size(name: str) -> int | None:
    """``hugetlb.2MB.max`` -> 2097152; the kernel names sizes KB/MB/GB (binary). None otherwise."""
    m = _CGROUP_HUGETLB_RE.match(name)
    if not m or len(m.group(1)) > 12:
        return None
    return int(m.group(1)) << {"KB": 10, "MB": 20, "GB": 30, "TB": 40}[m.group(2)]
