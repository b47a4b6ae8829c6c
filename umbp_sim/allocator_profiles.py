"""The built-in allocators' profiles and what mori's log would show.

Two allocators over one support layer (csrc/allocator), named by profile:

- ``umbp-sim``: mori's allocator plus umbp-sim's fixes (``umbp_sim_allocator.cpp``);
- ``mori-624002c`` (alias ``mori``): a model of mori's ``HostMemAllocator`` at ROCm/mori commit
  624002c, the allocator the field runs (``mori_624002c_allocator.cpp``,
  ``docs/deployed-behaviour.md``).

The names are declared here once (:data:`PROFILES`, :data:`ALIASES`); ``umbp_sim.allocator``
maps each to its native class. Replay, preflight and run model the field by default
(:data:`FIELD_PROFILE`). ``umbp-sim profiles`` prints :func:`difference_table`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from umbp_sim.errors import UmbpSimError
from umbp_sim.vocabulary.exit_codes import EX_USAGE

if TYPE_CHECKING:  # an allocator's server loads this module: each module it holds is forked
    import datetime

FIXED_PROFILE = "umbp-sim"
FIELD_PROFILE = "mori-624002c"
PROFILES = (FIXED_PROFILE, FIELD_PROFILE)
ALIASES = {"mori": FIELD_PROFILE}


@dataclass(frozen=True)
class Difference:
    """One decision the two allocators take differently: what each does, and the lines of
    mori's src/umbp/local/host_mem_allocator.cpp (commit 624002c) the mori model reproduces.
    Data for the table only: each allocator's code takes its own decision."""

    decision: str
    umbp_sim: str
    mori: str
    mori_lines: str


DIFFERENCES: tuple[Difference, ...] = (
    Difference(
        "after a failed MADV_POPULATE_WRITE",
        "unmap: demote on hugetlb EFAULT, touch by hand on EINVAL, else fail",
        "warn, touch every page by hand (SIGBUS on hugetlb with no page on the node)",
        "151-164",
    ),
    Difference(
        "before mbind",
        "reads /sys/devices/system/node/possible; binds only a node it lists",
        "no check, mbind is always called",
        "167-187",
    ),
    Difference(
        "maxnode passed to mbind",
        "node + 2: the node's bit is among the maxnode - 1 the kernel reads",
        "word_count * 64, so node 63 (mod 64) is dropped: EINVAL, never bound",
        "178",
    ),
    Difference(
        "a node past the kernel's 32768-bit mask",
        "refused with a warning, no mask built",
        "builds numa_node/64+1 words (256 MiB for 2^31-1); a refused malloc escapes alloc as "
        "MemoryError",
        "171-175",
    ),
    Difference(
        "hugepage_size of 1..4096",
        "demotes at once (MAP_HUGE_* cannot encode it)",
        "only a power of two is checked; 1 maps default-size hugepages with mapped_size == "
        "size (free's munmap then fails), 2..4096 ask the kernel",
        "218-226, 387",
    ),
    Difference(
        "what free unmaps",
        "its own table's buffer; a stale copy of a handle is refused",
        "the handle's address and size: a stale copy unmaps whatever is there now and takes the "
        "shm registry record (and fd) of the buffer at that address",
        "451-494",
    ),
    Difference(
        "warning texts",
        "umbp-sim's, with the size's hugepage counters",
        "mori's MORI_UMBP_WARN lines; nothing for size 0, rounding overflow, a failed anonymous "
        "mmap, an unknown backing",
        "130-133, 157-160, 205, 260, 266, 275, 308-310, 347, 464-467, 485-488, 567",
    ),
    Difference(
        "once-only hugetlb fallback warnings",
        "once per (backing, step, size, errno)",
        "one std::once_flag for every hugetlb fallback of the process, consumed even when the "
        "log level drops the line",
        "126-135",
    ),
    Difference(
        "an exception inside alloc",
        "every resource released, an invalid handle",
        "std::bad_alloc escapes alloc, leaving the mapping",
        "173: no try/catch around the nodemask vector",
    ),
    Difference(
        "when the shm registry record is written",
        "for a buffer it returns",
        "before mbind and prefault",
        "287-296, 370-379",
    ),
    Difference(
        "mmap flags of the hugetlb memfd (trace only)",
        "MAP_SHARED",
        "MAP_SHARED|MAP_HUGETLB",
        "355",
    ),
)


class ProfileError(UmbpSimError, ValueError):
    """An allocator profile name that is not one of :data:`PROFILES` (a usage error)."""

    exit_code = EX_USAGE


def canonical_profile(name: str) -> str:
    """``"mori"`` -> ``"mori-624002c"``; a known name as is; else :class:`ProfileError`."""
    name = ALIASES.get(name, name)
    if name not in PROFILES:
        raise ProfileError(
            f"unknown allocator profile {_shown(name)}: use one of {', '.join(PROFILES)} "
            f"(or {', '.join(repr(a) for a in ALIASES)})"
        )
    return name


def differences() -> list[dict[str, str]]:
    """:data:`DIFFERENCES` as plain data (``umbp-sim profiles --json``)."""
    return [asdict(d) for d in DIFFERENCES]


def difference_table() -> str:
    """The decisions the two allocators take differently, one row each, with mori's lines."""
    rows = [("decision", FIXED_PROFILE, FIELD_PROFILE, "mori source (lines)")]
    rows += [(d.decision, d.umbp_sim, d.mori, d.mori_lines) for d in DIFFERENCES]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join("  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3] for r in rows)


# ---- mori's log -------------------------------------------------------------------------------
# include/mori/utils/mori_log.hpp: logger "umbp" at ERROR unless MORI_UMBP_LOG_LEVEL, else
# MORI_GLOBAL_LOG_LEVEL, says otherwise; unknown level names read as error; stdout, pattern
# "[%Y-%m-%d %H:%M:%S.%e] [%P] [%n] [%^%l%$] %v". Every allocator line is a warning.
MORI_LOG_ENV = ("MORI_UMBP_LOG_LEVEL", "MORI_GLOBAL_LOG_LEVEL")
_LEVELS = {"trace": 0, "debug": 1, "info": 2, "warn": 3, "error": 4, "critical": 5}


def with_mori_warnings(env: dict[str, str], inherited: Mapping[str, str]) -> dict[str, str]:
    """``env`` plus MORI_UMBP_LOG_LEVEL=warn when neither it nor ``inherited`` (the process
    environment an allocator server starts with) sets a mori level: mori prints its warnings
    only at warn or below, and ``compare`` and ``run`` check them against the built-in
    allocators' (always collected)."""
    if any(name in env or name in inherited for name in MORI_LOG_ENV):
        return env
    return {"MORI_UMBP_LOG_LEVEL": "warn", **env}


def mori_log_level(env: Mapping[str, str]) -> str:
    """The level mori's ``umbp`` logger runs at under ``env``."""
    raw = env.get("MORI_UMBP_LOG_LEVEL")
    if raw is None:
        raw = env.get("MORI_GLOBAL_LOG_LEVEL")
    if raw is None:
        return "error"
    level = raw.strip().lower()
    return level if level in _LEVELS else "error"


def mori_log_lines(
    warnings: Iterable[str],
    env: Mapping[str, str],
    *,
    pid: int | None = None,
    when: datetime.datetime | None = None,
) -> list[str]:
    """What mori's log shows of the allocator's warnings: nothing at the default level.

    Lines carry spdlog's prefix; the time and pid are placeholders unless given.
    """
    if _LEVELS[mori_log_level(env)] > _LEVELS["warn"]:
        return []
    stamp = when.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] if when else "<time>"
    who = str(pid) if pid is not None else "<pid>"
    return [f"[{stamp}] [{who}] [umbp] [warning] {w}" for w in warnings]


def _shown(value: object) -> str:
    from umbp_sim.vocabulary.bounded import shown  # when an error is written: --help stays light

    return shown(value)
