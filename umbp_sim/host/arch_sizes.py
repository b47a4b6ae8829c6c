"""What the kernel decides from the architecture and its base page size: the hugepage sizes it
registers at boot, the default (PMD) size and the user address space (docs/kernel-model.md
sections 6 and 8)."""

from __future__ import annotations

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

# docs/kernel-model.md section 8.
ARM64_SIZES = {
    4 * KiB: [64 * KiB, 2 * MiB, 32 * MiB, GiB],
    16 * KiB: [2 * MiB, 32 * MiB, GiB],
    64 * KiB: [2 * MiB, 512 * MiB, 16 * GiB],
}
# ppc64 (book3s64): the sizes depend on the MMU, not the base page (arch/powerpc
# check_and_get_huge_psize): hash 16M and 16G, radix 2M and 1G; the default is the first.
PPC64_ARCHES = ("ppc64le", "ppc64")
PPC64_SIZES = {"hash": [16 * MiB, 16 * GiB], "radix": [2 * MiB, GiB]}


def ppc64_mmu(hugepage_sizes: list[int] | None) -> str:
    """A ppc64 host's MMU as its hugepage sizes show it: hash when 16 MiB or 16 GiB is one of
    them, else radix (POWER9 and later boot with radix when the firmware offers it)."""
    return "hash" if set(hugepage_sizes or ()) & set(PPC64_SIZES["hash"]) else "radix"


def default_hugepage_sizes(arch: str, page_size: int, mmu: str = "radix") -> list[int]:
    """The hugepage sizes a kernel registers at boot for ``arch`` and base ``page_size``
    (``mmu``: ppc64's, ``hash`` or ``radix``)."""
    if arch == "arm64":
        return list(ARM64_SIZES.get(page_size, [2 * MiB]))
    if arch == "x86_64":
        return [2 * MiB, GiB]
    if arch == "s390x":
        return [MiB]
    if arch in PPC64_ARCHES:
        return list(PPC64_SIZES.get(mmu, PPC64_SIZES["radix"]))
    return [2 * MiB]


def pmd_size(arch: str, page_size: int, hugepage_sizes: list[int] | None = None) -> int:
    """The default hugepage size: the PMD size of the base page; on ppc64 the MMU's default
    (16 MiB on hash, 2 MiB on radix), which ``hugepage_sizes`` tells apart."""
    if arch == "arm64":
        return {4 * KiB: 2 * MiB, 16 * KiB: 32 * MiB, 64 * KiB: 512 * MiB}.get(page_size, 2 * MiB)
    if arch == "s390x":
        return MiB
    if arch in PPC64_ARCHES:
        return PPC64_SIZES[ppc64_mmu(hugepage_sizes)][0]
    return 2 * MiB


def task_size(arch: str) -> int:
    """The size of a process's user address space (TASK_SIZE; docs/kernel-model.md section 6):
    what a mmap without an address hint can reach. x86_64 with 4-level paging (a 5-level kernel
    maps above it only on request), arm64 with 48-bit VA, s390x 2^53, others 2^47."""
    if arch == "arm64":
        return 1 << 48
    if arch == "s390x":
        return 1 << 53
    return (1 << 47) - 4096 if arch == "x86_64" else 1 << 47
