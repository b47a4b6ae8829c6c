"""The architecture and base page size a dump shows (issue 28 point 1, umbp_sim/dump/arch.py).

The dumps are small fakes shaped like the real ones that were misread (hwloc's POWER7, POWER9
and Itanium dumps, a 503 GiB x86_64 whose old kernel prints ``HighTotal: 0 kB``, an x86 with a
stray size directory): proc/cpuinfo, the kernel string, meminfo and the size directories weigh
together, the collector's record wins, and an architecture umbp-sim does not model says so.
"""

from __future__ import annotations

import json

import pytest
from fake_dumps import tar_bytes

from umbp_sim.commands.inspect import render_table
from umbp_sim.diagnose import diagnose
from umbp_sim.diagnose.replay_request import Request
from umbp_sim.diagnose.report import render_text
from umbp_sim.dump import load_dump
from umbp_sim.host.arch_sizes import default_hugepage_sizes, pmd_size
from umbp_sim.machine import Machine
from umbp_sim.request import AllocRequest

K, M, G = 1 << 10, 1 << 20, 1 << 30
HP = "sys/kernel/mm/hugepages"


def dump(files: dict[str, str], sizes_kb: tuple[int, ...] = ()) -> bytes:
    """A tarball under H/ with ``files`` and a hugepage directory (pool 0) per size."""
    tree = {f"H/{rel}": text.encode() for rel, text in files.items()}
    for kb in sizes_kb:
        tree[f"H/{HP}/hugepages-{kb}kB/nr_hugepages"] = b"0\n"
    return tar_bytes(tree)


def meminfo(total_kb: int = 16 << 20, hugepagesize_kb: int | None = 2048, extra: str = "") -> str:
    text = f"MemTotal: {total_kb} kB\nMemFree: {total_kb // 2} kB\n{extra}"
    if hugepagesize_kb:
        text += f"HugePages_Total: 0\nHugePages_Free: 0\nHugepagesize: {hugepagesize_kb} kB\n"
    return text


def power(cpu: str, mmu: str | None = None, platform: str = "pSeries") -> str:
    procs = "".join(
        f"processor\t: {i}\ncpu\t\t: {cpu}, altivec supported\nclock\t\t: 3800.000000MHz\n"
        "revision\t: 2.2 (pvr 004e 1202)\n\n"
        for i in range(2)
    )
    tail = f"timebase\t: 512000000\nplatform\t: {platform}\nmodel\t\t: IBM,9009-22A\n"
    return procs + tail + (f"MMU\t\t: {mmu}\n" if mmu else "")


X86_FLAGS = "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush"
ITANIUM = (
    "processor  : 0\nvendor     : GenuineIntel\narch       : IA-64\nfamily     : Itanium 2\n"
    "model      : 1\nrevision   : 1\narchrev    : 0\nfeatures   : branchlong, 16-byte atomic ops\n"
)


def x86(lm: bool = True) -> str:
    flags = X86_FLAGS + (" nx lm constant_tsc" if lm else " nx constant_tsc")
    return (
        "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 29\n"
        f"model name\t: Genuine Intel(R) CPU @ 2.66GHz\nflags\t\t: {flags}\n\n"
    )


def arch_note(notes: list[str]) -> str:
    (note,) = [n for n in notes if n.startswith(("page size", "architecture"))]
    return note


def test_power9_hash_with_only_16mib_reads_as_ppc64le() -> None:
    # issue 28: `cpu : POWER9`, a kernel ending .ppc64le, 16 MiB the only size (no directory)
    m, f = load_dump(
        dump(
            {
                "proc/cpuinfo": power("POWER9 (architected)"),
                "proc/meminfo": meminfo(hugepagesize_kb=16384),
                "proc/sys/kernel/osrelease": "4.18.0-305.el8.ppc64le\n",
            }
        )
    )
    assert (m.arch, m.page_size, m.hugepage_sizes, m.default_hugepage_size) == (
        "ppc64le",
        64 * K,
        [16 * M],
        16 * M,
    )
    assert arch_note(f.notes) == (
        "page size 64 KiB, ppc64le: kernel '4.18.0-305.el8.ppc64le' (proc/sys/kernel/osrelease)"
        "; hash MMU: hugepage sizes 16 MiB"
    )


def test_power9_hash_and_radix_from_the_mmu_line() -> None:
    m, f = load_dump(
        dump(
            {
                "proc/cpuinfo": power("POWER9 (raw)", "Hash"),
                "proc/meminfo": meminfo(hugepagesize_kb=16384),
            },
            (16384, 16777216),
        )
    )
    assert (m.arch, m.page_size, m.hugepage_sizes, m.default_hugepage_size) == (
        "ppc64le",
        64 * K,
        [16 * M, 16 * G],
        16 * M,
    )
    assert f.mmu == "hash"
    assert arch_note(f.notes) == (
        "page size 64 KiB, ppc64le: proc/cpuinfo 'cpu : POWER9 (raw)' (little-endian assumed, "
        "as distributions run POWER8 and later); hash MMU: proc/cpuinfo 'MMU : Hash'"
    )
    m, f = load_dump(
        dump(
            {
                "proc/cpuinfo": power("POWER9 (raw)", "Radix", "PowerNV"),
                "proc/meminfo": meminfo(hugepagesize_kb=None),
            },
            (2048, 1048576),
        )
    )
    assert (m.arch, m.page_size, m.hugepage_sizes, m.default_hugepage_size) == (
        "ppc64le",
        64 * K,
        [2 * M, G],
        2 * M,  # no Hugepagesize line: radix's default, the PMD size
    )
    assert f.mmu == "radix" and "radix MMU: proc/cpuinfo 'MMU : Radix'" in arch_note(f.notes)


def test_power7_is_big_endian_hash() -> None:
    m, f = load_dump(
        dump(
            {
                "proc/cpuinfo": power("POWER7 (architected)"),
                "proc/meminfo": meminfo(hugepagesize_kb=None),
            },
            (16384,),
        )
    )
    assert (m.arch, m.page_size, m.hugepage_sizes, m.default_hugepage_size) == (
        "ppc64",
        64 * K,
        [16 * M],
        16 * M,
    )
    assert arch_note(f.notes) == (
        "page size 64 KiB, ppc64: proc/cpuinfo 'cpu : POWER7 (architected)' (big-endian "
        "assumed before POWER8); hash MMU: hugepage sizes 16 MiB"
    )


ITANIUM_NOTE = (
    "architecture ia64 (from proc/cpuinfo 'arch : IA-64') is not modelled: replayed with 16 KiB "
    "pages (ia64's default) and the hugepage sizes the dump lists, under the rules umbp-sim "
    "models for x86_64 and arm64"
)


def test_itanium_says_it_is_not_modelled_on_inspect_and_replay() -> None:
    raw = dump({"proc/cpuinfo": ITANIUM, "proc/meminfo": meminfo(hugepagesize_kb=262144)})
    m, f = load_dump(raw)
    assert (m.arch, m.page_size, m.hugepage_sizes) == ("ia64", 16 * K, [256 * M])
    assert not f.arch_modelled and arch_note(f.notes) == ITANIUM_NOTE
    table = render_table(f.to_json(), m.mem_available)
    assert table.startswith("dump H: ia64,") and f"note: {ITANIUM_NOTE}" in table.splitlines()
    d = diagnose(m, f, Request(AllocRequest(G, "Anonymous")))
    assert f"dump note: {ITANIUM_NOTE}" in d.causes
    assert f"   - dump note: {ITANIUM_NOTE}" in render_text(d).splitlines()


def test_32bit_arm_is_not_modelled() -> None:
    cpuinfo = (
        "Processor\t: ARMv7 Processor rev 1 (v7l)\nprocessor\t: 0\nBogoMIPS\t: 1595.80\n\n"
        "Features\t: swp half thumb fastmult vfp edsp neon vfpv3\nCPU implementer\t: 0x41\n"
        "CPU architecture: 7\n"
    )
    m, f = load_dump(dump({"proc/cpuinfo": cpuinfo, "proc/meminfo": meminfo(1 << 20, None)}))
    assert (m.arch, m.page_size, f.arch_modelled) == ("arm", 4 * K, False)
    assert arch_note(f.notes).startswith(
        "architecture arm (from proc/cpuinfo 'CPU architecture: 7') is not modelled: replayed "
        "with 4 KiB pages (arm's default)"
    )


def test_503gib_x86_64_whose_old_kernel_prints_hightotal_0() -> None:
    # hwloc's 96em64t: a 2.6 x86_64 kernel prints HighTotal/LowTotal, HighTotal is 0
    extra = (
        "HighTotal:           0 kB\nHighFree:            0 kB\nLowTotal:     527617788 kB\n"
        "VmallocTotal: 34359738367 kB\n"
    )
    m, f = load_dump(
        dump({"proc/cpuinfo": x86(), "proc/meminfo": meminfo(527617788, 2048, extra)}, (2048,))
    )
    assert (m.arch, m.page_size) == ("x86_64", 4 * K)
    assert arch_note(f.notes) == (
        "page size 4 KiB, x86_64: proc/cpuinfo 'vendor_id : GenuineIntel', meminfo VmallocTotal "
        "34359738367 kB (a 64-bit kernel)"
    )
    # without VmallocTotal: more than PAE's 64 GiB is a 64-bit kernel too
    m, _ = load_dump(dump({"proc/cpuinfo": x86(), "proc/meminfo": meminfo(527617788, 2048)}))
    assert m.arch == "x86_64"


def test_32bit_x86_kernels_still_read_as_i386() -> None:
    high = "HighTotal: 1179296 kB\nVmallocTotal: 114680 kB\n"
    m, f = load_dump(dump({"proc/cpuinfo": x86(), "proc/meminfo": meminfo(2075428, None, high)}))
    assert m.arch == "i386"
    m, f = load_dump(dump({"proc/cpuinfo": x86(lm=False), "proc/meminfo": meminfo(1 << 20)}))
    assert m.arch == "i386" and arch_note(f.notes).endswith("flags lack 'lm'")


def test_one_stray_size_directory_does_not_flip_the_arch() -> None:
    vmalloc = "VmallocTotal: 34359738367 kB\n"
    m, f = load_dump(
        dump({"proc/cpuinfo": x86(), "proc/meminfo": meminfo(extra=vmalloc)}, (64, 2048, 1048576))
    )
    assert (m.arch, m.page_size, m.hugepage_sizes) == ("x86_64", 4 * K, [64 * K, 2 * M, G])
    assert arch_note(f.notes).endswith(
        "; hugepage size(s) 64 KiB are not among those x86_64 registers (2 MiB, 1 GiB): kept as "
        "the dump lists them"
    )
    # hwloc's 2i386-2t-hugepagesizecount: a 32-bit x86 with a 16 GiB directory (was arm64 64K)
    high = "HighTotal: 136968 kB\n"
    m, _ = load_dump(
        dump(
            {"proc/cpuinfo": x86(), "proc/meminfo": meminfo(1 << 20, 2048, high)}, (2048, 16777216)
        )
    )
    assert (m.arch, m.page_size) == ("i386", 4 * K)


def test_kernel_strings_name_the_arch() -> None:
    for release, arch in [
        ("3.10.0-1160.el7.x86_64", "x86_64"),
        ("6.1.0-13-amd64", "x86_64"),
        ("5.14.0-284.el9.aarch64", "arm64"),
        ("5.10.0-8-arm64", "arm64"),
        ("4.18.0-305.el8.ppc64le", "ppc64le"),
        ("5.14.0-70.el9.s390x", "s390x"),
        ("2.6.32-754.el6.i686", "i386"),
        ("4.19.0-6-686-pae", "i386"),
        ("2.6.16.60-0.21-default.ia64", "ia64"),
    ]:
        m, f = load_dump(
            dump(
                {
                    "proc/meminfo": meminfo(hugepagesize_kb=None),
                    "proc/sys/kernel/osrelease": release,
                }
            )
        )
        assert m.arch == arch, release
        assert f"kernel '{release}' (proc/sys/kernel/osrelease)" in arch_note(f.notes)
    # arm64 64K kernels say so in their release
    m, _ = load_dump(
        dump({"proc/meminfo": meminfo(), "proc/sys/kernel/osrelease": "5.14.0-70.el9.aarch64+64k"})
    )
    assert (m.arch, m.page_size) == ("arm64", 64 * K)


def test_the_collectors_record_wins() -> None:
    manifest = json.dumps({"tool": "umbp-sim collect", "machine": "ppc64le", "page_size": 65536})
    m, f = load_dump(
        dump({"umbp-sim-collect.json": manifest, "proc/meminfo": meminfo()}, (2048, 1048576))
    )
    assert (m.arch, m.page_size, f.mmu) == ("ppc64le", 64 * K, "radix")
    assert arch_note(f.notes) == (
        "page size 64 KiB, ppc64le: uname -m 'ppc64le' and page size 65536 recorded by the "
        "collector; radix MMU: hugepage sizes 2 MiB, 1 GiB"
    )


@pytest.mark.parametrize("mmu", ["hash", "radix"])
def test_machine_ppc64le(mmu: str) -> None:
    m = Machine.ppc64le(mmu=mmu, nodes=2, hugepages={"16MiB" if mmu == "hash" else "2MiB": 8})
    sizes = {"hash": [16 * M, 16 * G], "radix": [2 * M, G]}[mmu]
    assert (m.arch, m.page_size, m.hugepage_sizes) == ("ppc64le", 64 * K, sizes)
    assert m.default_hugepage_size == sizes[0] == pmd_size("ppc64le", 64 * K, sizes)
    assert default_hugepage_sizes("ppc64le", 64 * K, mmu) == sizes
    assert m.pool_total(sizes[0]) == 8
