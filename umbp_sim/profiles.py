"""The built-in allocator's profiles and what mori's log would show.

One allocator (csrc/allocator), its decision points a policy (csrc/allocator/policy.h), two
profiles:

- ``umbp-sim``: mori's allocator plus umbp-sim's fixes;
- ``mori-624002c`` (alias ``mori``): mori's ``HostMemAllocator`` at ROCm/mori commit 624002c,
  the allocator the field runs (``docs/deployed-behaviour.md``).

Replay, preflight and run model the field by default (:data:`FIELD_PROFILE`).
``umbp-sim profiles`` prints :func:`difference_table`.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping

from umbp_sim.errors import UmbpSimError

PROFILES = ("umbp-sim", "mori-624002c")
ALIASES = {"mori": "mori-624002c"}
FIELD_PROFILE = "mori-624002c"
FIXED_PROFILE = "umbp-sim"

# Each decision point: what it decides, and the lines of mori's
# src/umbp/local/host_mem_allocator.cpp (commit 624002c) the mori profile reproduces.
FIELDS: dict[str, tuple[str, str]] = {
    "populate_failure": (
        "after a failed MADV_POPULATE_WRITE",
        "151-164: warn, touch every page by hand (SIGBUS on hugetlb with no page on the node)",
    ),
    "check_possible_nodes": (
        "reads /sys/devices/system/node/possible before mbind",
        "167-187: no check, mbind is always called",
    ),
    "maxnode": (
        "maxnode passed to mbind",
        "178: word_count * 64, so node 63 (mod 64) is dropped: EINVAL, never bound",
    ),
    "cap_nodemask": (
        "refuses nodes past the kernel's 32768-bit mask without building one",
        "171-175: builds numa_node/64+1 words (256 MiB for 2^31-1); a refused malloc "
        "escapes alloc as MemoryError",
    ),
    "hugepage_size_above_base_page": (
        "hugepage_size must exceed the base page",
        "218-226, 387: only a power of two; 1 maps default-size hugepages with mapped_size "
        "== size (free's munmap then fails), 2..4096 ask the kernel",
    ),
    "free_trusts_handle": (
        "free unmaps the handle's address and size",
        "451-494: a stale copy unmaps whatever is there now and takes the shm registry "
        "record (and fd) of the buffer at that address",
    ),
    "mori_texts": (
        "warning texts are mori's MORI_UMBP_WARN lines",
        "130-133, 157-160, 205, 260, 266, 275, 308-310, 347, 464-467, 485-488, 567; "
        "nothing for size 0, rounding overflow, a failed anonymous mmap, an unknown backing",
    ),
    "one_hugetlb_warning_per_process": (
        "one warning for every hugetlb fallback of the process",
        "126-135: one std::once_flag, consumed even when the log level drops the line",
    ),
    "exceptions_escape": (
        "std::bad_alloc escapes alloc, leaving the mapping",
        "173: no try/catch around the nodemask vector",
    ),
    "register_shm_before_policies": (
        "shm registry record written before mbind and prefault",
        "287-296, 370-379",
    ),
    "map_hugetlb_on_memfd": (
        "maps the hugetlb memfd with MAP_SHARED|MAP_HUGETLB (trace only)",
        "355",
    ),
}


class ProfileError(UmbpSimError, ValueError):
    """An allocator profile name that is not one of :data:`PROFILES` (a usage error)."""

    exit_code = 64


def canonical_profile(name: str) -> str:
    """``"mori"`` -> ``"mori-624002c"``; a known name as is; else :class:`ProfileError`."""
    name = ALIASES.get(name, name)
    if name not in PROFILES:
        raise ProfileError(
            f"unknown allocator profile {_shown(name)}: use one of {', '.join(PROFILES)} "
            "(or 'mori')"
        )
    return name


def policies() -> dict[str, dict[str, object]]:
    """Every profile's decision points, as the native allocator has them."""
    import umbp_sim._native as _native

    return dict(_native.allocator_profiles())


def difference_table() -> str:
    """The decision points where the profiles differ, one row each, with mori's source lines."""
    pols = policies()
    a, b = pols[FIXED_PROFILE], pols[FIELD_PROFILE]
    rows = [("decision point", FIXED_PROFILE, FIELD_PROFILE, "mori source (lines)")]
    for key, (what, source) in FIELDS.items():
        if a[key] != b[key]:
            rows.append((f"{key}: {what}", str(a[key]), str(b[key]), source))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    out = []
    for r in rows:
        out.append("  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3])
    return "\n".join(out)


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
    from umbp_sim.bounded import shown  # when an error is written: --help stays light

    return shown(value)
