"""Byte sizes as people write them, read as written and printed back the same way.

=================  =============================  =======================================
written            means                          as in
=================  =============================  =======================================
``4096``, ``4096B``  bytes
``KB MB GB TB PB``  10**3 .. 10**15 (decimal, SI)  sglang (``--hicache-size`` is GB = 10**9),
                                                  disk vendors, ``dd``/``truncate`` ``GB``
``KiB .. PiB``      2**10 .. 2**50 (binary, IEC)   the kernel's sysfs, ``numfmt --to=iec-i``
``K M G T P``       2**10 .. 2**50 (binary)        ``dd``, ``truncate``, ``docker --memory``,
                                                  ``java -Xmx``, sglang's ``2M`` env mistake
``kB``              2**10                          the kernel's own spelling in /proc/meminfo
                                                  and ``hugepages-2048kB``
=================  =============================  =======================================

Units are case-insensitive except ``kB`` (exactly so, as the kernel writes it) against ``KB``
(1000). Fractions are accepted when the result is a whole number of bytes: ``1.5GiB``,
``0.5GB``, ``2.5K``; ``1.3B`` is refused. ``parse_size`` returns a ``Size``: an ``int`` that
remembers the unit it was written in, so messages can print it back (``format_size``).
"""

from __future__ import annotations

import re

# lower-cased unit -> bytes
_UNITS: dict[str, int] = {"": 1, "b": 1}
for _i, _p in enumerate("kmgtp", 1):
    _UNITS[_p] = 1 << (10 * _i)  # K M G T P: binary
    _UNITS[f"{_p}ib"] = 1 << (10 * _i)  # KiB .. PiB
    _UNITS[f"{_p}b"] = 10 ** (3 * _i)  # KB .. PB: decimal
KERNEL_KB = "kB"  # exactly: the kernel's KiB
_SPELLING = {  # canonical spelling of each lower-cased unit
    **{f"{p}ib": f"{p.upper()}iB" for p in "kmgtp"},
    **{f"{p}b": f"{p.upper()}B" for p in "kmgtp"},
    **{p: p.upper() for p in "kmgtp"},
    "b": "B",
    "": "",
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*$", re.ASCII)
_BINARY = (("PiB", 1 << 50), ("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


class SizeError(ValueError):
    """A size that cannot be read; the message names the value."""


class Size(int):
    """Bytes, remembering the unit they were written in (``unit``: ``"GB"``, ``"GiB"``, ``""``).

    Behaves as the int it is everywhere (``str()``, JSON, TOML print the number);
    ``format_size(size)`` prints it back in its own unit (``100GB``).
    """

    unit: str

    def __new__(cls, value: int, unit: str = "") -> Size:
        obj = super().__new__(cls, value)
        obj.unit = unit
        return obj

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (Size, (int(self), self.unit))


def unit_bytes(unit: str) -> int | None:
    """Bytes per ``unit`` as written (``"GB"`` -> 10**9, ``"kB"`` -> 1024), None if unknown."""
    if unit == KERNEL_KB:
        return 1 << 10
    return _UNITS.get(unit.lower())


def _shown(value: object) -> str:
    from umbp_sim.vocabulary.bounded import shown  # when an error is written: --help stays light

    return shown(value)


def parse_size(value: int | str, what: str = "size") -> Size:
    """Bytes from an int or a string with a unit (table above), as a ``Size``.

    Raises SizeError naming ``what`` and the value for anything else, including negatives,
    fractions that are not whole bytes, and unknown units.
    """
    if isinstance(value, bool):
        raise SizeError(f"{what}: expected a size, got {_shown(value)}")
    if isinstance(value, int):
        if value < 0:
            raise SizeError(f"{what}: size must not be negative, got {_shown(value)}")
        return value if isinstance(value, Size) else Size(value)
    if not isinstance(value, str):
        raise SizeError(f"{what}: expected a size such as 4096 or '2MiB', got {_shown(value)}")
    m = _SIZE_RE.match(value)
    per = unit_bytes(m.group(2)) if m else None
    if not m or per is None or len(m.group(1)) > 40:
        raise SizeError(
            f"{what}: cannot read size {_shown(value)} (use bytes or a unit: KiB, MiB, GiB, TiB "
            "(binary); KB, MB, GB, TB (decimal); kB as the kernel writes it)"
        )
    number, unit = m.group(1), m.group(2)
    scaled, tenths = _decimal(number)
    whole, rest = divmod(scaled * per, tenths)
    if rest:
        raise SizeError(f"{what}: {value.strip()!r} is not a whole number of bytes")
    spelled = unit if unit == KERNEL_KB else _SPELLING[unit.lower()]
    return Size(whole, spelled)


def _decimal(number: str) -> tuple[int, int]:
    """A decimal as written (``"1.5"``, ``"2."``, ``".25"``) as ``(scaled, 10**digits)``, its
    value exactly ``scaled / 10**digits``. Integer arithmetic, not ``fractions``: this module
    is loaded by an allocator's server, and every module it holds makes each fork dearer."""
    whole, _, frac = number.partition(".")
    return int(whole or "0") * 10 ** len(frac) + int(frac or "0"), 10 ** len(frac)


def format_size(n: int, unit: str | None = None) -> str:
    """``n`` bytes in ``unit`` (``format_size(1500000000, "GB")`` -> ``1.5GB``), up to 3
    decimals and exact when it can be; without a unit (or ``n`` a ``Size``: its own unit),
    the shortest exact binary spelling: 2097152 -> '2MiB', 4096 -> '4KiB', 1000 -> '1000B'."""
    if unit is None and isinstance(n, Size) and n.unit:
        unit = n.unit
    if unit:
        per = unit_bytes(unit)
        if per is not None:
            if n % per == 0:
                return f"{n // per}{unit}"
            text = f"{n / per:.3f}".rstrip("0").rstrip(".")
            scaled, tenths = _decimal(text)
            approx = "" if scaled * per == n * tenths else "~"
            return f"{approx}{text}{unit}"
    if unit == "":  # written as plain bytes
        return str(int(n))
    for name, mult in _BINARY:
        if n >= mult and n % mult == 0:
            return f"{n // mult}{name}"
    return f"{int(n)}B"


def spaced_size(n: int) -> str:
    """``n`` bytes as a sentence writes a page size: 4096 -> '4 KiB', 65536 -> '64 KiB'."""
    text = format_size(n)
    digits = len(text) - len(text.lstrip("0123456789"))
    return f"{text[:digits]} {text[digits:]}"


def size_at_most(n: int, like: int) -> tuple[str, int]:
    """The largest size not above ``n`` bytes, written in ``like``'s unit, and its bytes: a
    size for a command line, never an approximation nor a long byte count. A decimal unit (a
    ``Size`` written in GB or MB: sglang's and a user's) keeps it, to 3 decimals; otherwise
    (binary units, or bytes as an error line gives them) whole MiB in their shortest exact
    binary spelling (bytes below 1 MiB).

    >>> size_at_most(55_296_000_123, Size(100 * 10**9, "GB"))
    ('55.296GB', 55296000000)
    >>> size_at_most(3 << 30, 100), size_at_most(5798203392, Size(8 << 30, "GiB"))
    (('3GiB', 3221225472), ('5529MiB', 5797576704))
    """
    unit = like.unit if isinstance(like, Size) else ""
    per = unit_bytes(unit) if unit else None
    if per and per > 1 and 10 ** (len(str(per)) - 1) == per:  # a power of ten: GB, MB, ...
        milli = n * 1000 // per  # thousandths of the unit, rounded down: whole bytes
        text = f"{milli // 1000}.{milli % 1000:03d}".rstrip("0").rstrip(".")
        return f"{text}{unit}", milli * per // 1000
    floored = n // (1 << 20) * (1 << 20) if n >= 1 << 20 else n
    return format_size(floored), floored


def size_key(size: int) -> str:
    """A size as a TOML table key: its exact binary spelling (``2MiB``, ``1536B``), else the
    plain byte count (a ``Size`` whose own unit does not divide it: ``1.5GB`` -> ``1500000000``).
    """
    text = format_size(size)
    return text if re.fullmatch(r"[0-9]+[A-Za-z]+", text) else str(size)


def pod_hugepages_limit(size: int, nbytes: int) -> str:
    """A Kubernetes pod spec's limit that lets its container fault ``nbytes`` of ``size``
    hugepages (Kubernetes sets the container's hugetlb cgroup limit from it):
    ``resources.limits.hugepages-2Mi: 4096Mi``."""
    unit, shift = ("Gi", 30) if size >= 1 << 30 else ("Mi", 20)
    return f"resources.limits.hugepages-{size >> shift}{unit}: {-(-nbytes // (1 << 20))}Mi"


def cgroup_hugetlb_name(size: int) -> str:
    """The kernel's name for a hugetlb cgroup size (mm/hugetlb_cgroup.c mem_fmt): 2MB, 1GB, 64KB."""
    for unit, shift in (("GB", 30), ("MB", 20)):
        if size >= 1 << shift:
            return f"{size >> shift}{unit}"
    return f"{size >> 10}KB"
