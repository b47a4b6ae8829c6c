"""What each key of an input table takes, checked once, and the one line when a value is not it.

Scenario files (``umbp_sim.scenario.schema``), ``Machine`` fields (``umbp_sim.machine``) and
fault rules declare their keys with these types; :func:`check` walks a value against one and
raises :class:`ValueTypeError` naming the key path::

    [machine].nodes: expected an integer, got a string ('2')
    [request].size: 100000000000000000000 bytes is beyond what the simulator holds (...)

Every text is bounded: values are shown with ``umbp_sim.vocabulary.bounded`` (``shown``: at most a
few dozen characters, an integer of 5,000 digits as ``a 5000-digit integer``; ``short_list``:
``0, 1, 2, ... (999,997 more)``). Numbers are bounded too: an ``Int`` or ``Size`` has a range
the simulator holds, so no key can ask for unbounded work.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from umbp_sim.vocabulary.bounded import shown
from umbp_sim.vocabulary.units import SizeError, parse_size

# What the simulator holds. Byte counts are uint64 in the SimKernel and are added together
# (node sums, commit limits, a size rounded up to a hugepage): each is kept below 2**62 so a
# few of them still add up in 64 bits. Real hosts are below 2**52 (4 PiB). Page counts are
# C++ longs; kernel release numbers and node ids are ints. (umbp_sim.dump.limits uses these.)
MAX_BYTES = 1 << 62
MAX_INT = (1 << 31) - 1


class ValueTypeError(ValueError):
    """A value that is not what its key takes; ``key`` is the path, ``reason`` the rest."""

    def __init__(self, key: str, reason: str) -> None:
        self.key = key
        self.reason = reason
        super().__init__(f"{key}: {reason}" if key else reason)


def toml_type(value: Any) -> str:
    """The value's type as a TOML file spells it: ``a string``, ``an integer``, ``an array``."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, Mapping):
        return "a table"
    if value is None:
        return "nothing"
    name = type(value).__name__
    if name in ("datetime", "date", "time"):
        return f"a {name}"
    return f"a {name}"


def got(value: Any) -> str:
    """``a string ('2')``: the type, then the value (bounded)."""
    if isinstance(value, (list, tuple, Mapping)) and not value:
        return f"an empty {'table' if isinstance(value, Mapping) else 'array'}"
    return f"{toml_type(value)} ({shown(value)})"


# ---- the types -----------------------------------------------------------------------------


class Spec:
    """A value type. ``check(value, key)`` raises ValueTypeError or returns None."""

    what = "a value"

    def check(self, value: Any, key: str) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _expected(self, value: Any, key: str) -> ValueTypeError:
        return ValueTypeError(key, f"expected {self.what}, got {got(value)}")


@dataclass(frozen=True)
class Int(Spec):
    """An integer (never a boolean) in ``lo .. hi``; ``beyond``: the text past ``hi``."""

    lo: int | None = 0
    hi: int | None = MAX_INT
    beyond: str | None = None

    what = "an integer"

    def check(self, value: Any, key: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._expected(value, key)
        if self.hi is not None and value > self.hi and self.beyond:
            raise ValueTypeError(key, f"{shown(value)} {self.beyond}")
        if self.lo is not None and value < self.lo:
            both = self.hi is not None and self.hi <= MAX_INT and self.lo >= -MAX_INT - 1
            rng = f"in {self.lo:,}..{self.hi:,}" if both else f"at least {self.lo:,}"
            raise ValueTypeError(key, f"must be {rng}, got {shown(value)}")
        if self.hi is not None and value > self.hi:
            both = self.hi <= MAX_INT and self.lo is not None and self.lo >= -MAX_INT - 1
            rng = f"in {self.lo:,}..{self.hi:,}" if both else f"at most {self.hi:,}"
            raise ValueTypeError(key, f"must be {rng}, got {shown(value)}")


BEYOND_BYTES = "bytes is beyond what the simulator holds (below 2^62 bytes)"


@dataclass(frozen=True)
class Size(Spec):
    """Bytes: an integer, or a string with a unit (``"2MiB"``) when ``written``; below ``hi``."""

    hi: int = MAX_BYTES - 1
    written: bool = True
    lo: int = 0

    @property
    def what(self) -> str:  # type: ignore[override]
        return "a size (bytes, or a string such as '2MiB')" if self.written else "an integer"

    def check(self, value: Any, key: str) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise self._expected(value, key)
        if isinstance(value, str) and not self.written:
            raise self._expected(value, key)
        try:
            n = parse_size(value, key)
        except SizeError as e:
            raise ValueTypeError(key, str(e).removeprefix(f"{key}: ")) from None
        if n > self.hi:
            shown_n = shown(value) if isinstance(value, str) else shown(n)
            if self.hi == MAX_BYTES - 1:
                raise ValueTypeError(key, f"{shown_n} {BEYOND_BYTES}")
            raise ValueTypeError(key, f"{shown_n} is beyond {self.hi:,} bytes")
        if n < self.lo:
            raise ValueTypeError(key, f"must be at least {self.lo} bytes, got {shown(value)}")


@dataclass(frozen=True)
class Number(Spec):
    """A finite integer or float in ``lo .. hi``."""

    lo: float = 0.0
    hi: float = 1e18

    what = "a number"

    def check(self, value: Any, key: str) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._expected(value, key)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueTypeError(key, f"{value!r} is not a finite number")
        if not self.lo <= value <= self.hi:
            raise ValueTypeError(key, f"must be in {self.lo:g}..{self.hi:g}, got {shown(value)}")


@dataclass(frozen=True)
class Bool(Spec):
    what = "true or false"

    def check(self, value: Any, key: str) -> None:
        if not isinstance(value, bool):
            raise self._expected(value, key)


@dataclass(frozen=True)
class Str(Spec):
    """A string; ``choices``: one of them; ``max_len``: at most that many characters."""

    choices: tuple[str, ...] | None = None
    max_len: int | None = None
    nonempty: bool = False

    what = "a string"

    def check(self, value: Any, key: str) -> None:
        if self.choices is not None:
            if not isinstance(value, str) or value not in self.choices:
                raise ValueTypeError(key, f"{shown(value)} is not one of {', '.join(self.choices)}")
            return
        if not isinstance(value, str):
            raise self._expected(value, key)
        if self.nonempty and not value:
            raise ValueTypeError(key, "must not be empty")
        if self.max_len is not None and len(value) > self.max_len:
            raise ValueTypeError(
                key, f"{len(value):,} characters; at most {self.max_len:,} are read"
            )


@dataclass(frozen=True)
class Array(Spec):
    """An array of ``item``; between ``min_len`` and ``max_len`` items."""

    item: Spec
    min_len: int = 0
    max_len: int | None = None

    @property
    def what(self) -> str:  # type: ignore[override]
        return f"an array of {_plural(self.item)}"

    def check(self, value: Any, key: str) -> None:
        if not isinstance(value, (list, tuple)):
            raise self._expected(value, key)
        if len(value) < self.min_len:
            raise ValueTypeError(key, f"expected {self.what} (at least {self.min_len})")
        if self.max_len is not None and len(value) > self.max_len:
            raise ValueTypeError(key, f"{len(value):,} items; at most {self.max_len:,}")
        for i, v in enumerate(value):
            self.item.check(v, f"{key}[{i}]")


@dataclass(frozen=True)
class Table(Spec):
    """A table of any keys (each a ``key`` value: a size such as ``"2MiB"``, or any string)
    to ``value``; at most ``max_len`` entries."""

    value: Spec
    key: Spec | None = None
    max_len: int | None = 64
    what_text: str = "a table"

    @property
    def what(self) -> str:  # type: ignore[override]
        return self.what_text

    def check(self, value: Any, key: str) -> None:
        if not isinstance(value, Mapping):
            raise self._expected(value, key)
        if self.max_len is not None and len(value) > self.max_len:
            raise ValueTypeError(key, f"{len(value):,} entries; at most {self.max_len:,}")
        for k, v in value.items():
            if self.key is not None:
                self.key.check(k, f"{key} key {shown(k)}")
            self.value.check(v, _join(key, k) if isinstance(k, str) else f"{key}[{shown(k)}]")


@dataclass(frozen=True)
class Fields(Spec):
    """A table of known keys, each with its type; unknown keys are refused, ``required`` keys
    must be there."""

    fields: Mapping[str, Spec]
    required: frozenset[str] = field(default_factory=frozenset)

    what = "a table"

    def check(self, value: Any, key: str) -> None:
        if not isinstance(value, Mapping):
            raise self._expected(value, key)
        check_keys(value, self.fields, key)
        for k in sorted(self.required):
            if k not in value:
                raise ValueTypeError(_join(key, k), "missing")
        for k, v in value.items():
            self.fields[k].check(v, _join(key, k))


@dataclass(frozen=True)
class Custom(Spec):
    """Any other rule: ``test(value, key)`` raises ValueTypeError naming ``key`` (or below)."""

    test: Callable[[Any, str], None]
    what_text: str = "a value"

    @property
    def what(self) -> str:  # type: ignore[override]
        return self.what_text

    def check(self, value: Any, key: str) -> None:
        self.test(value, key)


def _plural(spec: Spec) -> str:
    if isinstance(spec, Size) and spec.written:
        return "sizes (bytes, or strings such as '2MiB')"
    what = spec.what
    for article in ("an ", "a "):
        if what.startswith(article):
            what = what[len(article) :]
            break
    if what.startswith("integer") or what.startswith("string") or what.startswith("table"):
        head, _, tail = what.partition(" ")
        return f"{head}s" + (f" {tail}" if tail else "")
    return what


def keyname(key: Any) -> str:
    """A key as a path part: itself, or bounded (a 1 MB key, a key with a newline)."""
    if isinstance(key, str) and len(key) <= 80 and key.isprintable():
        return key
    return shown(key)


def _join(where: str, key: Any) -> str:
    return f"{where}.{keyname(key)}" if where else keyname(key)


def check_keys(table: Mapping[str, Any], allowed: Iterable[str], where: str) -> None:
    """Refuse a key not in ``allowed``: ``where.key: unknown key (allowed: a, b, c)``."""
    names = set(allowed)
    for k in table:
        if k not in names:
            hint = ", ".join(sorted(names))
            raise ValueTypeError(_join(where, k), f"unknown key (allowed: {hint})")


def check(spec: Spec, value: Any, key: str) -> None:
    """Check ``value`` against ``spec``; ValueTypeError naming ``key`` (and the path below)."""
    spec.check(value, key)
