"""sglang's host-memory check before the HiCache host pool is allocated: meminfo read as psutil
reads it (kB, the file's unit), the available bytes, the 10 GiB reserve, and sglang's error text.
``umbp_sim.sglang.sizing`` re-exports them. Must not import torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from umbp_sim.sglang.kv_model import SizingError
from umbp_sim.vocabulary.meminfo import meminfo_lines

# sglang: HICACHE_HOST_MEMORY_RESERVE_BYTES = 10 * (1024**3), left for the OS and other processes.
HICACHE_HOST_MEMORY_RESERVE_BYTES = 10 * (1 << 30)


def host_memory_error(requested_bytes: int, available_bytes: int) -> str:
    """sglang's exact ValueError text (available is MemAvailable minus the 10 GiB reserve)."""
    return (
        f"Not enough host memory available. Requesting "
        f"{requested_bytes / 1e9:.2f} GB but only have "
        f"{available_bytes / 1e9:.2f} GB free. Please reduce the "
        f"size of the hierarchical cache."
    )


def parse_meminfo(text: str, source: str = "meminfo") -> dict[str, int]:
    """``/proc/meminfo`` as {field: value in the file's unit (kB for most, count for HugePages_*)}.

    A line that is not ``Name: number [kB]`` is an error naming ``source`` and the line number.
    """
    out: dict[str, int] = {}
    for t in meminfo_lines(text.splitlines()):
        parts = t.value.split()
        if (
            not t.has_colon
            or not t.key.strip()
            or not 1 <= len(parts) <= 2
            or not parts[0].isdigit()
        ):
            raise SizingError(f"{source}:{t.lineno}: cannot read meminfo line {t.raw!r}")
        out[t.key.strip()] = int(parts[0])
    return out


def read_meminfo(path: str | os.PathLike[str] = "/proc/meminfo") -> dict[str, int]:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError as e:
        raise SizingError(f"{os.fspath(path)}: cannot read meminfo ({e.strerror})") from None
    return parse_meminfo(text, os.fspath(path))


def _zoneinfo_watermark_low_pages(path: str | os.PathLike[str] | None) -> int | None:
    if path is None:
        return None
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return sum(
                int(parts[1])
                for parts in (line.split() for line in f)
                if len(parts) >= 2 and parts[0] == "low" and parts[1].isdigit()
            )
    except OSError:
        return None


def host_available_bytes(
    meminfo: Mapping[str, int] | str | os.PathLike[str] = "/proc/meminfo",
    *,
    zoneinfo: str | os.PathLike[str] | None = None,
    page_size: int = 4096,
    watermark_low_pages: int | None = None,
) -> int:
    """What sglang reads as free host memory: ``psutil.virtual_memory().available`` on Linux.

    That is MemAvailable (kB * 1024). Like psutil: when MemAvailable is absent (kernel < 3.14)
    or 0 it is estimated from MemFree, the file LRU, SReclaimable and the zones' low watermarks
    (``zoneinfo``; without it, MemFree + Cached); a negative result is 0 and one above MemTotal
    is MemFree. ``meminfo`` is a dict from parse_meminfo or a path to a meminfo file. Note that
    a reserved hugetlb pool is not in MemAvailable: this is the check's blind spot.
    """
    if isinstance(meminfo, Mapping):
        mems = dict(meminfo)
    else:
        if zoneinfo is None:
            zoneinfo = os.path.join(os.path.dirname(os.fspath(meminfo)), "zoneinfo")
        mems = read_meminfo(meminfo)
    for needed in ("MemTotal", "MemFree"):
        if needed not in mems:
            raise SizingError(f"meminfo: {needed} missing")

    def kb(name: str, default: int = 0) -> int:
        return mems.get(name, default) * 1024

    total, free = kb("MemTotal"), kb("MemFree")
    avail = kb("MemAvailable")
    if avail == 0:
        avail = free + kb("Cached")
        lru = ("Active(file)", "Inactive(file)", "SReclaimable")
        low_pages = (
            watermark_low_pages
            if watermark_low_pages is not None
            else _zoneinfo_watermark_low_pages(zoneinfo)
        )
        if all(k in mems for k in lru) and low_pages is not None:
            low = low_pages * page_size
            pagecache = kb("Active(file)") + kb("Inactive(file)")
            sreclaim = kb("SReclaimable")
            # psutil's float arithmetic, kept as is so the result matches it.
            est: float = free - low
            est += pagecache - min(pagecache / 2, low)
            est += sreclaim - min(sreclaim / 2.0, low)
            avail = int(est)
    if avail < 0:
        return 0
    if avail > total:
        return free
    return avail


def hugetlb_pool_bytes(meminfo: Mapping[str, int]) -> int:
    """Bytes reserved in the default-size hugetlb pool (HugePages_Total * Hugepagesize).

    None of it is in MemAvailable, so sglang's host check cannot see it even when it is free.
    """
    return mem_field(meminfo, "HugePages_Total", 0) * mem_field(meminfo, "Hugepagesize", 0) * 1024


def mem_field(meminfo: Mapping[str, int], name: str, default: int | None = None) -> int:
    """One meminfo field (in the file's unit); a missing one is ``default`` or an error."""
    if name in meminfo:
        return meminfo[name]
    if default is None:
        raise SizingError(f"meminfo: {name} missing")
    return default


def host_memory_budget(
    meminfo: Mapping[str, int] | str | os.PathLike[str] = "/proc/meminfo",
    *,
    zoneinfo: str | os.PathLike[str] | None = None,
    watermark_low_pages: int | None = None,
) -> int:
    """``available - 10 GiB``: the most a HiCache host pool may request (can be negative).

    ``watermark_low_pages``: Σ low watermarks of /proc/zoneinfo, for a meminfo without
    MemAvailable (instead of reading ``zoneinfo``).
    """
    available = host_available_bytes(
        meminfo, zoneinfo=zoneinfo, watermark_low_pages=watermark_low_pages
    )
    return available - HICACHE_HOST_MEMORY_RESERVE_BYTES


def check_host_memory(requested_bytes: int, available_bytes: int) -> None:
    """Raise sglang's ValueError when ``requested_bytes`` exceeds the budget.

    ``available_bytes`` is the budget (MemAvailable - 10 GiB), as in sglang's message.
    """
    if requested_bytes > available_bytes:
        raise ValueError(host_memory_error(requested_bytes, available_bytes))
