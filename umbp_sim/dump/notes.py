"""Dump notes: what the reader took, assumed or could not find, each with a stable code.

A ``Note`` is its text exactly as printed (a ``str``: printed, compared and written to JSON as
that text) and ``code``, the rule that wrote it, one of ``CODES``. Code that acts on notes
selects them by code (``umbp_sim/diagnose/explain.py``), never by words of their text; the
``inspect --json`` document lists the codes beside the texts (``note_codes``).
"""

from __future__ import annotations

# code -> the rule that writes the note
CODES: dict[str, str] = {
    # the architecture and the hugepage sizes (read_pools.py, arch.py)
    "arch": "the architecture and base page size, and what showed them",
    "arch-not-modelled": "an architecture umbp-sim does not model, replayed under x86_64's rules",
    "hugepage-sizes-from-nodes": "no sys/kernel/mm/hugepages: the sizes of the nodes' pools",
    "hugepage-size-assumed": "no size anywhere but HugePages_* lines: the arch's default size",
    "hugepage-size-from-meminfo": "no size directories: meminfo's Hugepagesize is the only size",
    "hugepage-size-added": "meminfo's Hugepagesize has no directory: added to the sizes",
    "default-hugepage-size-assumed": "no Hugepagesize line: the default size inferred",
    "no-hugetlb": "no hugepage sizes: a kernel without CONFIG_HUGETLB_PAGE",
    # the pools (read_pools.py, build.py)
    "pool-sysfs-meminfo-differ": "a sysfs pool count and meminfo's differ: sysfs is used",
    "pool-spread": "no per-node pool files: the pages spread round robin as the kernel does",
    "pool-summed-from-nodes": "no global pool counts: summed from the nodes",
    "pool-nodes-differ-global": "the nodes' pages differ from the global count: the nodes' used",
    "pool-counts-cut": "a pool's free or surplus count above its total: cut to the total",
    "reserved-cut": "more pages reserved than free: the reserved count cut",
    # memory figures (facts.py, hwloc.py, build.py)
    "meminfo-from-nodes": "no proc/meminfo: the host-wide figures summed from the nodes' files",
    "meminfo-figure-missing": "no proc/meminfo: a figure the nodes' files do not carry",
    "hugepage-figure-missing": "no proc/meminfo: a hugepage figure the nodes' files do not carry",
    "page-cache-from-cached": "no Active(file)/Inactive(file): page cache as Cached - Shmem",
    "page-cache-from-filepages": "no Active(file)/Inactive(file): page cache as FilePages - Shmem",
    "mem-available-estimated": "no MemAvailable line: estimated as si_mem_available does",
    "node-memtotal-mismatch": "the nodes' MemTotal do not add up to meminfo's",
    "node-meminfo-missing": "a node without meminfo: given a share of the unaccounted MemTotal",
    # nodes (read_system.py, build.py)
    "bare-meminfo": "a bare meminfo: no NUMA information, one node",
    "no-numa-sysfs": "no sys/devices/system/node: no NUMA information, one node",
    "nodes-from-online-list": "no nodeN directories: the nodes of the online list",
    "possible-nodes-extended": "the possible list lacks nodes the dump has: they are added",
    # sysctls, kernel, limits (read_system.py, build.py, sosreport.py)
    "kernel-version-from-proc-version": "no osrelease: the kernel version from proc/version",
    "kernel-version-assumed": "no kernel release in the dump: the version meminfo's lines date",
    "overcommit-ratio-solved": "no overcommit_ratio: solved from CommitLimit",
    "overcommit-ratio-default": "no overcommit_ratio: the kernel default",
    "overcommit-memory-default": "no overcommit_memory: the kernel default",
    "reserve-default": "no admin_reserve_kbytes / user_reserve_kbytes: the kernel default",
    "rlimit-as-unknown": "proc/self/limits without a 'Max address space' line",
    "cgroup-v1-limit": "a cgroup v1 limit file (*.limit_in_bytes) read as its v2 name",
    "hugetlbfs-files": "files left in hugetlbfs mounts hold pages: named, with the fix",
    "credentials-unknown": "no proc/self/status credentials: the server taken as privileged",
    "credentials-unprivileged": "the server ran without CAP_SYS_ADMIN (proc/self/status)",
    "credentials-unreadable": "proc/self/status has no readable Uid / CapEff line",
    "sos-commands": "a file served from a sosreport's sos_commands/",
    "field-not-in-dump": "a Machine field no dump carries: the default",
    "path-ignored": "a path leaving the dump (absolute, '..' or a link): ignored",
    "hugepage-path-ignored": "a hugepage file leaving the dump (absolute, '..' or a link): ignored",
    # a paste (paste.py, and the readers when the source is one): what it does not show is
    # unknown, each assumption said with the command that settles it
    "paste-unreadable": "paste lines in no form umbp-sim reads: listed, not used",
    "paste-repeated": "a value given twice in a paste: the later line's used",
    "paste-nodes-assumed": "a paste shows node N but not the nodes below it: taken to exist",
    "memory-assumed": "no MemTotal in a paste: the nodes' sum, else the pools plus a margin",
    "kernel-version-unknown": "no kernel release in a paste: a recent kernel assumed",
    "hugepages-assumed": "a hugepage size a paste does not show: registered, with 0 pages",
    "pool-free-assumed": "a paste gives a pool's size, not its free count: all free assumed",
    "pool-total-assumed": "a paste gives a pool's free count, not its size: none in use assumed",
    "limits-assumed": "no cgroup or process limit in a paste: none assumed",
    "pod-no-hugepages": "a pod's limits name no hugepages-<size>: Kubernetes' hugetlb limit 0",
    "pod-limits-cut": "a pod's limits end the paste: its hugepages limit is not shown",
}


class Note(str):
    """One dump note: the text as printed, with ``code`` (one of ``CODES``) beside it.

    >>> n = Note("no-hugetlb", "no hugepage sizes: kernel without CONFIG_HUGETLB_PAGE")
    >>> n.code, n == "no hugepage sizes: kernel without CONFIG_HUGETLB_PAGE"
    ('no-hugetlb', True)
    """

    code: str

    def __new__(cls, code: str, text: str) -> Note:
        if code not in CODES:
            raise ValueError(f"{code!r} is not a dump note code (umbp_sim/dump/notes.py)")
        note = super().__new__(cls, text)
        note.code = code
        return note

    def __getnewargs__(self) -> tuple[str, str]:  # type: ignore[override]
        return (self.code, str(self))  # copies and pickles keep the code
