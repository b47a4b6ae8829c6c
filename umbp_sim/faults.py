"""Fault plans: what goes wrong, as data. A ``FaultPlan`` is a list of ``FaultRule`` and a seed.

It reads and writes the ``[[faults]]`` array of tables that scenario files use, so a schedule a
test finds can be saved and replayed, and ``plan.wrap(kernel)`` puts it over any kernel
(``_native.LinuxKernel()``, a SimKernel, a TracingKernel...) as a ``_native.FaultyKernel``.

TOML schema (every key but ``op`` and one of ``errno``/``signal`` is optional)::

    fault_seed = 7                 # plan seed for probability draws (default 0)

    [[faults]]
    name = "no 2 MiB pages"        # shown in records
    op = "mmap"                    # mmap munmap madvise mbind memfd_create ftruncate close
                                   # read_file touch
    errno = "ENOMEM"               # the answer: an errno by name, or
    signal = "SIGBUS"              # a simulated fatal signal (any op but read_file), or
    content = "0-3\\n"              # read_file only: these bytes instead of the file's, or
    throw = "bad_alloc"            # the call throws std::bad_alloc (MemoryError in Python):
                                   # the kernel layer ran out of memory
    # which matching calls fire: at most one of nth / calls / every / first (none: all of them)
    nth = 3                        # the 3rd matching call (1-based)
    calls = [2, 5]                 # the 2nd..5th, inclusive
    every = 10                     # the 10th, 20th, ...
    first = 2                      # the 1st and 2nd
    probability = 0.1              # and-ed with the above; a pure function of (seed, rule, call)
    seed = 7                       # this rule's seed (default: fault_seed)
    max_fires = 1                  # stop after firing this many times
    # argument filters (a call that fails one is not counted by the rule)
    flags_has = "MAP_HUGETLB|MAP_HUGE_2MB"         # mmap; "A|B" or a list of names
    flags_lacks = ["MAP_NORESERVE"]                # mmap
    min_length = "1GiB"            # mmap munmap madvise mbind ftruncate touch; bytes or a size
    max_length = "2MiB"
    advice = "MADV_POPULATE_WRITE" # madvise
    node = 3                       # mbind: node 3 is in the mask
    mode = "MPOL_BIND"             # mbind: the mode without MPOL_F_* flags
    memfd_flags_has = ["MFD_HUGETLB"]              # memfd_create
    memfd_flags_lacks = ["MFD_ALLOW_SEALING"]      # memfd_create
    path = "/sys/devices/system/node/*"            # read_file: exact path or fnmatch glob

Semantics (implemented by the native FaultyKernel): a rule counts every call that matches its
operation and filters; rules are tried in order and the first that fires answers the call, the
inner kernel is then not called (an injected munmap leaves the mapping mapped), except that
an injected close() error other than EBADF still closes the descriptor, as Linux does. The same
seed fires on the same per-rule call indices in every run; with several threads only the
assignment of indices to threads can vary.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from umbp_sim import _native
from umbp_sim.errors import UmbpSimError
from umbp_sim.vocabulary.bounded import shown
from umbp_sim.vocabulary.exit_codes import EX_DATAERR
from umbp_sim.vocabulary.toml_text import TomlError, read_toml
from umbp_sim.vocabulary.units import SizeError, format_size, parse_size
from umbp_sim.vocabulary.value_types import keyname


class FaultPlanError(UmbpSimError):
    """A bad fault plan; the message is one line naming the rule and key."""

    exit_code = EX_DATAERR


# The seam's operations a rule can name, from their one declaration (UMBP_KERNEL_CALLS in
# csrc/kernel/kernel.h, through the extension).
OPS: tuple[str, ...] = tuple(_native.SYSCALL_OPS)
_LENGTH_OPS = ("mmap", "munmap", "madvise", "mbind", "ftruncate", "touch")
_SCHEDULE_KEYS = ("nth", "calls", "every", "first")
# filter key -> the operations it applies to
_FILTER_OPS: dict[str, tuple[str, ...]] = {
    "flags_has": ("mmap",),
    "flags_lacks": ("mmap",),
    "min_length": _LENGTH_OPS,
    "max_length": _LENGTH_OPS,
    "advice": ("madvise",),
    "node": ("mbind",),
    "mode": ("mbind",),
    "memfd_flags_has": ("memfd_create",),
    "memfd_flags_lacks": ("memfd_create",),
    "path": ("read_file",),
}

_STRING_KEYS = ("op", "errno", "signal", "content", "throw", "advice", "mode", "path", "name")
_NAME_KEYS = ("flags_has", "flags_lacks", "memfd_flags_has", "memfd_flags_lacks")
_ERRNOS: dict[str, int] = dict(_native.syscall_names("errno"))
_SIGNALS: dict[str, int] = dict(_native.syscall_names("signal"))
_MAP_FLAGS: dict[str, int] = dict(_native.syscall_names("mmap_flags"))
_MAP_TYPES = {"MAP_SHARED": 1, "MAP_PRIVATE": 2, "MAP_SHARED_VALIDATE": 3}
_ADVICE: dict[str, int] = dict(_native.syscall_names("advice"))
_MPOL_MODES: dict[str, int] = dict(_native.syscall_names("mpol_mode"))
_MFD_FLAGS: dict[str, int] = dict(_native.syscall_names("memfd_flags"))
_HUGE_RE = re.compile(r"^(MAP|MFD)_HUGE_(\d+)(KB|MB|GB)$")
_HUGE_UNITS = {"KB": 10, "MB": 20, "GB": 30}


def _fail(where: str, key: str, msg: str) -> FaultPlanError:
    return FaultPlanError(f"{where}.{key}: {msg}")


def _huge_log2(name: str, prefix: str) -> int | None:
    """log2 of the page size a MAP_HUGE_2MB / MFD_HUGE_1GB name encodes; None if not one."""
    m = _HUGE_RE.match(name)
    if not m or m.group(1) != prefix:
        return None
    n = int(m.group(2))
    if n <= 0 or n & (n - 1):
        return None
    log2 = n.bit_length() - 1 + _HUGE_UNITS[m.group(3)]
    return log2 if log2 < 64 else None


def _names(value: Any, where: str, key: str) -> tuple[str, ...]:
    if isinstance(value, str):
        parts = [p.strip() for p in value.split("|")]
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        parts = [p.strip() for p in value]
    else:
        raise _fail(where, key, f"expected flag names (a list or 'A|B'), got {shown(value)}")
    if not parts or any(not p for p in parts):
        raise _fail(where, key, f"empty flag name in {shown(value)}")
    return tuple(parts)


# The native FaultRule's counters, seeds and lengths are uint64_t (csrc/kernel/faulty_kernel.h).
U64_MAX = (1 << 64) - 1


def _int(value: Any, where: str, key: str, minimum: int, maximum: int = U64_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(where, key, f"expected an integer, got {shown(value)}")
    if value < minimum:
        raise _fail(where, key, f"must be >= {minimum}, got {shown(value)}")
    if value > maximum:
        raise _fail(where, key, f"{shown(value)} does not fit in 64 bits")
    return value


@dataclass(frozen=True)
class FaultRule:
    """One rule, by name. Construct directly or through ``FaultPlan.from_dict``; invalid values
    raise FaultPlanError naming the key."""

    op: str
    errno: str | None = None
    signal: str | None = None
    content: str | None = None
    throw: str | None = None
    nth: int | None = None
    calls: tuple[int, int] | None = None
    every: int | None = None
    first: int | None = None
    probability: float | None = None
    seed: int | None = None
    max_fires: int | None = None
    flags_has: tuple[str, ...] = ()
    flags_lacks: tuple[str, ...] = ()
    min_length: int | None = None
    max_length: int | None = None
    advice: str | None = None
    node: int | None = None
    mode: str | None = None
    memfd_flags_has: tuple[str, ...] = ()
    memfd_flags_lacks: tuple[str, ...] = ()
    path: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        self.validate("fault rule")

    # ---- checking ------------------------------------------------------------------------
    def validate(self, where: str) -> None:
        """Raise FaultPlanError (naming ``where`` and the key) unless the rule is consistent."""
        for key in _STRING_KEYS:  # a rule built directly: the types from_dict ensures
            v = getattr(self, key)
            if v is not None and not isinstance(v, str):
                raise _fail(where, key, f"expected a string, got {shown(v)}")
        for key in _NAME_KEYS:
            v = getattr(self, key)
            if not isinstance(v, tuple) or not all(isinstance(n, str) for n in v):
                raise _fail(where, key, f"expected a tuple of flag names, got {shown(v)}")
        if self.op not in OPS:
            ops = ", ".join(OPS)
            raise _fail(where, "op", f"unknown operation {shown(self.op)} (one of {ops})")
        answers = [
            k for k in ("errno", "signal", "content", "throw") if getattr(self, k) is not None
        ]
        if len(answers) != 1:
            raise _fail(
                where,
                answers[1] if answers else "errno",
                "give exactly one of errno, signal, content, throw",
            )
        if self.errno is not None and self.errno not in _ERRNOS:
            raise _fail(where, "errno", f"unknown errno {shown(self.errno)}")
        if self.signal is not None:
            if self.signal not in _SIGNALS:
                raise _fail(where, "signal", f"unknown signal {shown(self.signal)}")
            if self.op == "read_file":
                raise _fail(where, "signal", "read_file cannot be answered with a signal")
        if self.throw is not None and self.throw != "bad_alloc":
            raise _fail(where, "throw", f"only 'bad_alloc' can be thrown, got {shown(self.throw)}")
        if self.content is not None:
            if not isinstance(self.content, str):
                raise _fail(where, "content", f"expected a string, got {shown(self.content)}")
            if self.op != "read_file":
                raise _fail(where, "content", f"only read_file takes content, not {self.op}")
        given = [k for k in _SCHEDULE_KEYS if getattr(self, k) is not None]
        if len(given) > 1:
            raise _fail(where, given[1], f"use only one of {', '.join(_SCHEDULE_KEYS)}")
        for k in ("nth", "every"):
            if getattr(self, k) is not None:
                _int(getattr(self, k), where, k, 1)
        if self.first is not None:
            _int(self.first, where, "first", 0)
        if self.calls is not None:
            c = self.calls
            if (
                not isinstance(c, tuple)
                or len(c) != 2
                or any(isinstance(v, bool) or not isinstance(v, int) for v in c)
                or not 1 <= c[0] <= c[1]
            ):
                raise _fail(
                    where, "calls", f"expected [a, b] with 1 <= a <= b, got {shown(list(c))}"
                )
            _int(c[1], where, "calls", 1)  # b < 2^64
        p = self.probability
        if p is not None and (
            isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0
        ):
            raise _fail(where, "probability", f"expected a number in [0, 1], got {shown(p)}")
        if self.seed is not None:
            _int(self.seed, where, "seed", 0)
        if self.max_fires is not None:
            _int(self.max_fires, where, "max_fires", 1)
        for key, applies in _FILTER_OPS.items():
            v = getattr(self, key)
            if v is not None and v != () and self.op not in applies:
                only = ", ".join(applies)
                raise _fail(where, key, f"does not apply to op {self.op!r} (only {only})")
        for key in ("flags_has", "flags_lacks"):
            for n in getattr(self, key):
                if n not in _MAP_FLAGS and _huge_log2(n, "MAP") is None:
                    raise _fail(where, key, f"unknown mmap flag {shown(n)}")
            types = [n for n in getattr(self, key) if n in _MAP_TYPES]
            huges = [n for n in getattr(self, key) if _huge_log2(n, "MAP") is not None]
            if len(types) > 1 or len(huges) > 1:
                raise _fail(where, key, "at most one mapping type and one MAP_HUGE_ size")
        for key in ("memfd_flags_has", "memfd_flags_lacks"):
            for n in getattr(self, key):
                if n not in _MFD_FLAGS and _huge_log2(n, "MFD") is None:
                    raise _fail(where, key, f"unknown memfd flag {shown(n)}")
            if len([n for n in getattr(self, key) if n not in _MFD_FLAGS]) > 1:
                raise _fail(where, key, "at most one MFD_HUGE_ size")
        for key in ("min_length", "max_length"):
            if getattr(self, key) is not None:
                _int(getattr(self, key), where, key, 0)
        if (
            self.min_length is not None
            and self.max_length is not None
            and self.min_length > self.max_length
        ):
            raise _fail(where, "min_length", "is larger than max_length")
        if self.advice is not None and self.advice not in _ADVICE:
            raise _fail(where, "advice", f"unknown madvise advice {shown(self.advice)}")
        if self.mode is not None and self.mode not in _MPOL_MODES:
            raise _fail(where, "mode", f"unknown mbind mode {shown(self.mode)}")
        if self.node is not None:
            _int(self.node, where, "node", 0)
            if self.node >= 1 << 20:
                raise _fail(where, "node", f"node {self.node} is out of range")
        if self.path is not None and (not isinstance(self.path, str) or not self.path):
            raise _fail(where, "path", f"expected a non-empty path or glob, got {shown(self.path)}")
        if self.name is not None and not isinstance(self.name, str):
            raise _fail(where, "name", f"expected a string, got {shown(self.name)}")

    # ---- the [[faults]] table ------------------------------------------------------------
    @classmethod
    def from_dict(cls, table: Mapping[str, Any], where: str = "fault rule") -> FaultRule:
        """From one ``[[faults]]`` table; an unknown key or bad value names ``where`` and the key.

        >>> FaultRule.from_dict({"op": "close", "errno": "EINTR"}).to_dict()
        {'op': 'close', 'errno': 'EINTR'}
        """
        if not isinstance(table, Mapping):
            raise FaultPlanError(f"{where}: expected a table, got {shown(table)}")
        known = {f.name for f in fields(cls)}
        for key in table:
            if key not in known:
                raise _fail(where, keyname(key), "unknown key")
        if "op" not in table:
            raise _fail(where, "op", "missing")
        kw: dict[str, Any] = {}
        for key, value in table.items():
            if key in ("flags_has", "flags_lacks", "memfd_flags_has", "memfd_flags_lacks"):
                kw[key] = _names(value, where, key)
            elif key in ("min_length", "max_length"):
                try:
                    kw[key] = parse_size(value, f"{where}.{key}")
                except SizeError as e:
                    raise FaultPlanError(str(e)) from None
            elif key == "calls":
                if not isinstance(value, (list, tuple)) or len(value) != 2:
                    raise _fail(where, key, f"expected [a, b], got {shown(value)}")
                kw[key] = tuple(value)
            elif key in (
                "op",
                "errno",
                "signal",
                "content",
                "throw",
                "advice",
                "mode",
                "path",
                "name",
            ):
                if not isinstance(value, str):
                    raise _fail(where, key, f"expected a string, got {shown(value)}")
                kw[key] = value
            else:
                kw[key] = value
        rule = cls.__new__(cls)
        for f in fields(cls):
            object.__setattr__(rule, f.name, kw.get(f.name, f.default))
        rule.validate(where)
        return rule

    def to_dict(self) -> dict[str, Any]:
        """The TOML table: only keys that differ from the defaults, in schema order."""
        out: dict[str, Any] = {"name": self.name} if self.name is not None else {}
        for f in fields(self):
            if f.name == "name":
                continue
            v = getattr(self, f.name)
            if v is None or v == ():
                continue
            if f.name in ("flags_has", "flags_lacks", "memfd_flags_has", "memfd_flags_lacks"):
                v = "|".join(v)  # reads as C does: "MAP_HUGETLB|MAP_HUGE_2MB"
            elif f.name == "calls":
                v = list(v)
            elif f.name in ("min_length", "max_length"):
                v = format_size(v)
            out[f.name] = v
        return out

    # ---- native --------------------------------------------------------------------------
    def to_native(self, plan_seed: int = 0) -> Any:
        """The ``_native.FaultRule`` the C++ FaultyKernel applies (``plan_seed``: its draws)."""
        r = _native.FaultRule()
        r.name = self.name or ""
        r.op = self.op
        if self.errno is not None:
            r.error = _ERRNOS[self.errno]
        if self.signal is not None:
            r.signal = _SIGNALS[self.signal]
        r.throw_bad_alloc = self.throw is not None
        if self.nth is not None:
            r.when, r.a = "nth", self.nth
        elif self.calls is not None:
            r.when, r.a, r.b = "range", self.calls[0], self.calls[1]
        elif self.every is not None:
            r.when, r.a = "every", self.every
        elif self.first is not None:
            r.when, r.a = "first", self.first
        if self.probability is not None:
            r.probability = float(self.probability)
        r.seed = self.seed if self.seed is not None else plan_seed
        for key in ("content", "max_fires", "min_length", "max_length", "node", "path"):
            if getattr(self, key) is not None:
                setattr(r, key, getattr(self, key))
        # flags_has/_lacks (MAP_*) and memfd_flags_has/_lacks (MFD_*): a hugepage size and a
        # mapping type (MAP_ only) have fields of their own, the rest are bits.
        kinds = (("flags", "MAP", _MAP_FLAGS), ("memfd_flags", "MFD", _MFD_FLAGS))
        for key, prefix, bits_of in kinds:
            for suffix, neg in (("_has", ""), ("_lacks", "_not")):
                bits = 0
                for n in getattr(self, key + suffix):
                    huge = _huge_log2(n, prefix)
                    if huge is not None:
                        setattr(r, "huge_log2" + neg, huge)
                    elif prefix == "MAP" and n in _MAP_TYPES:
                        setattr(r, "map_type" + neg, _MAP_TYPES[n])
                    else:
                        bits |= bits_of[n]
                setattr(r, key + suffix, bits)
        if self.advice is not None:
            r.advice = _ADVICE[self.advice]
        if self.mode is not None:
            r.mode = _MPOL_MODES[self.mode]
        return r


@dataclass(frozen=True)
class FaultPlan:
    """An ordered list of rules and the seed of their probability draws.

    The first rule that matches a call answers it (an errno, a signal, file content or a
    thrown ``bad_alloc``) instead of the kernel below. Rules come from scenario files'
    ``[[faults]]`` tables, from TOML, or from ``FaultRule`` objects; ``wrap`` puts the plan over
    any kernel:

    >>> from umbp_sim import Machine, UMBPHostMemAllocator, simulate
    >>> from umbp_sim import UMBPHostBufferBacking as B
    >>> plan = FaultPlan.from_rules([{"op": "mmap", "errno": "ENOMEM", "nth": 1}])
    >>> with simulate(Machine.x86_64(hugepages={"2MiB": 8})) as host:
    ...     alloc = UMBPHostMemAllocator(kernel=plan.wrap(host.kernel))
    ...     h = alloc.alloc(4 << 20, B.AnonymousHugetlb)  # the 1st mmap (hugetlb) fails
    ...     print(h.actual_backing)
    ...     alloc.free(h)
    UMBPHostBufferBacking.Anonymous
    """

    rules: tuple[FaultRule, ...] = field(default_factory=tuple)
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "rules", tuple(self.rules))
        for i, r in enumerate(self.rules):
            if not isinstance(r, FaultRule):
                raise FaultPlanError(f"faults[{i}]: expected a FaultRule, got {shown(r)}")
        _int(self.seed, "plan", "fault_seed", 0)

    # ---- dict / TOML ---------------------------------------------------------------------
    @classmethod
    def from_rules(cls, tables: Sequence[Mapping[str, Any]], seed: int = 0) -> FaultPlan:
        """From the ``[[faults]]`` list (as parsed from a scenario file) and the plan seed.

        >>> FaultPlan.from_rules([{"op": "mmap", "errno": "ENOMEM", "every": 2}], seed=1).seed
        1
        """
        if not isinstance(tables, (list, tuple)):
            raise FaultPlanError(f"faults: expected an array of tables, got {shown(tables)}")
        rules = tuple(FaultRule.from_dict(t, f"faults[{i}]") for i, t in enumerate(tables))
        return cls(rules, seed)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> FaultPlan:
        """From ``{"faults": [...], "fault_seed": N}``; any other key is an error.

        >>> doc = {"faults": [{"op": "madvise", "errno": "EFAULT"}], "fault_seed": 3}
        >>> FaultPlan.from_dict(doc).rules[0].op
        'madvise'
        """
        if not isinstance(doc, Mapping):
            raise FaultPlanError(f"fault plan: expected a table, got {shown(doc)}")
        for key in doc:
            if key not in ("faults", "fault_seed"):
                raise FaultPlanError(f"{key}: unknown key (a fault plan has faults, fault_seed)")
        seed = _int(doc.get("fault_seed", 0), "plan", "fault_seed", 0)
        return cls.from_rules(doc.get("faults", []), seed)

    def to_dict(self) -> dict[str, Any]:
        """The plan as ``from_dict`` reads it (defaults left out).

        >>> FaultPlan.from_rules([{"op": "mmap", "errno": "ENOMEM", "nth": 1}]).to_dict()
        {'faults': [{'op': 'mmap', 'errno': 'ENOMEM', 'nth': 1}]}
        """
        out: dict[str, Any] = {}
        if self.seed:
            out["fault_seed"] = self.seed
        out["faults"] = [r.to_dict() for r in self.rules]
        return out

    @classmethod
    def from_toml(cls, source: str | os.PathLike[str]) -> FaultPlan:
        """From TOML text, or from a file: a ``Path``, or a str with no newline, '=' or '['.

        >>> FaultPlan.from_toml('faults = [{ op = "close", errno = "EIO" }]').rules[0].errno
        'EIO'
        """
        if isinstance(source, os.PathLike) or (
            isinstance(source, str) and not any(c in source for c in "\n=[")
        ):
            path = Path(source)
            try:
                text = path.read_text()
            except OSError as e:
                raise FaultPlanError(f"{path}: cannot read: {e.strerror}") from None
            where = f"{path}: "
        else:
            text, where = str(source), ""
        try:
            doc = read_toml(text)
        except TomlError as e:
            raise FaultPlanError(f"{where}invalid TOML: {e}") from None
        try:
            return cls.from_dict(doc)
        except FaultPlanError as e:
            raise FaultPlanError(f"{where}{e}") from None

    def to_toml(self) -> str:
        """The plan as TOML text (``from_toml`` reads it back to an equal plan).

        >>> print(FaultPlan.from_rules([{"op": "mmap", "errno": "ENOMEM", "nth": 1}]).to_toml())
        faults = [
            { op = "mmap", errno = "ENOMEM", nth = 1 },
        ]
        <BLANKLINE>
        """
        import tomli_w

        return tomli_w.dumps(self.to_dict())

    # ---- native --------------------------------------------------------------------------
    def native_rules(self) -> list[Any]:
        """The rules as ``_native.FaultRule`` objects (what ``wrap`` hands to the C++ side).

        >>> len(FaultPlan.from_rules([{"op": "close", "errno": "EIO"}]).native_rules())
        1
        """
        return [r.to_native(self.seed) for r in self.rules]

    def wrap(self, kernel: Any) -> Any:
        """A ``_native.FaultyKernel`` applying this plan over ``kernel`` (see the class example).

        >>> from umbp_sim import Machine, simulate
        >>> with simulate(Machine.x86_64()) as host:
        ...     faulty = FaultPlan.from_rules([{"op": "close", "errno": "EIO"}]).wrap(host.kernel)
        >>> type(faulty).__name__
        'FaultyKernel'
        """
        return _native.FaultyKernel(kernel, self.native_rules())
