"""Where a buffer's memory is bound and where its hugepages landed: compare's "numa binding";
how many of its pages the allocation faulted: compare's "faulted"; how it was mapped (shared or
private, anonymous or a file, protection, flags, page size): compare's "mapping".

Read from SimKernel's state after the allocation and the user's first write, before the free:
the NUMA policy recorded on the VMA that holds the handle's address (what ``mbind`` left), and
the hugepages each node's pools gave up since the allocation started. The same function serves
the built-in allocator (in process) and an external build (in its forked child), so a build that
binds to another node, or whose pages end up on another node, differs in this class.
"""

from __future__ import annotations

from typing import Any

from umbp_sim import _native
from umbp_sim.machine import Machine
from umbp_sim.sim import HugePages
from umbp_sim.vocabulary.units import format_size

# include/uapi/linux/mempolicy.h
POLICY_MODES = {
    0: "default",
    1: "preferred",
    2: "bind",
    3: "interleave",
    4: "local",
    5: "preferred-many",
    6: "weighted-interleave",
}


def pools_free(kernel: Any, machine: Machine) -> dict[tuple[int, int], int]:
    """{(hugepage size, node): free pages} of every pool of ``machine`` on ``kernel``."""
    out: dict[tuple[int, int], int] = {}
    for node in range(len(machine.nodes)):
        for size in machine.hugepage_sizes:
            counters = kernel.hugepage_counters(size, node)
            if counters:
                out[(size, node)] = HugePages(*counters).free
    return out


def binding(kernel: Any, machine: Machine, ptr: int, before: dict[tuple[int, int], int]) -> str:
    """``"bind 1; hugepages 2 x 2MiB on node 1"``: the policy of the VMA at ``ptr`` and the
    hugepages taken from each node's pools since ``before`` (``pools_free`` then)."""
    policy = "no mapping"
    for m in kernel.mappings():
        if m["start"] <= ptr < m["start"] + m["length"]:
            mode = POLICY_MODES.get(int(m["policy_mode"]), f"mode {m['policy_mode']}")
            nodes = ",".join(str(n) for n in m["policy_nodes"])
            policy = f"{mode} {nodes}" if nodes else mode
            break
    taken = [
        f"{before[key] - free} x {format_size(key[0])} on node {key[1]}"
        for key, free in sorted(pools_free(kernel, machine).items(), key=lambda kv: kv[0][::-1])
        if key in before and before[key] > free
    ]
    return policy + (f"; hugepages {', '.join(taken)}" if taken else "")


def faulted(kernel: Any, ptr: int, length: int) -> str:
    """``"1024 x 4KiB"``: the pages of the buffer [ptr, ptr + length) that SimKernel has faulted
    in, by page size (``"none"``): what a prefault did, read when alloc returns (before any
    write). A touch loop with the wrong stride, or a populate that is skipped, differs here."""
    pages: dict[int, int] = {}
    for m in kernel.mappings():
        if ptr <= m["start"] < ptr + length and m["faulted_pages"]:
            size = int(m["page_size"])
            pages[size] = pages.get(size, 0) + int(m["faulted_pages"])
    return ", ".join(f"{n} x {format_size(s)}" for s, n in sorted(pages.items())) or "none"


_C = _native.constants
# mmap flags a mapping keeps that change what the kernel does with it (include/uapi/asm-generic/
# mman*.h), by the word said for each.
_FLAG_WORDS = (("MAP_NORESERVE", "noreserve"), ("MAP_POPULATE", "populate"))


def mapping(kernel: Any, ptr: int) -> str:
    """``"shared file rw, 4KiB pages, file size 4194304, its fd close-on-exec"``: how the VMA at
    ``ptr`` was mapped (its sharing, whether a file (a memfd) backs it, its protection,
    MAP_NORESERVE / MAP_POPULATE, its page size; for a file its size, what a process given the
    fd sees, and its open fds with their close-on-exec flag). A memfd mapped private (its writes
    not seen through the fd), one truncated to the requested rather than the mapped size, or
    created without MFD_CLOEXEC, a buffer mapped read-only or without MAP_NORESERVE where the
    other had it, differs here."""
    for m in kernel.mappings():
        if m["start"] <= ptr < m["start"] + m["length"]:
            flags, prot = int(m["flags"]), int(m["prot"])
            words = [
                "shared" if m["shared"] else "private",
                "anonymous" if flags & _C["MAP_ANONYMOUS"] else "file",
                ("r" if prot & _C["PROT_READ"] else "") + ("w" if prot & _C["PROT_WRITE"] else "")
                or "none",
            ]
            words += [word for name, word in _FLAG_WORDS if flags & _C[name]]
            text = f"{' '.join(words)}, {format_size(int(m['page_size']))} pages"
            size = int(m["file_size"])
            if size < 0:
                return text
            return f"{text}, file size {size}, {_fds(len(m['file_fds']), m['file_fds_cloexec'])}"
    return "no mapping"


def _fds(n: int, cloexec: int) -> str:
    # An fd without close-on-exec goes to every program the process execs (a launcher, a
    # compiler): it keeps the memfd's pages after Free until that program ends.
    if n == 0:
        return "no fd open"
    if cloexec == n:
        return "its fd close-on-exec" if n == 1 else f"{n} fds close-on-exec"
    return "its fd inherited by exec" if n == 1 else f"{n - cloexec} of {n} fds inherited by exec"
