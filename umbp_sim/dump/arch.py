"""The architecture and base page size a dump shows (docs/kernel-model.md section 8).

The evidence, strongest first; the first that says decides the architecture, and the note
names it:

1. what the collector recorded (``umbp-sim-collect.json``: ``machine``, ``uname -m``, and
   ``page_size``, ``getconf PAGESIZE``): used as it is;
2. the kernel string: ``proc/sys/kernel/osrelease``, ``proc/version`` (its release, and a
   compiler triplet such as ``aarch64-linux-gnu-gcc``) or a sosreport's ``uname -a``:
   ``.x86_64``/``-amd64``, ``.i686``/``-686-pae``, ``.aarch64``/``-arm64``, ``.ppc64le``,
   ``.ppc64``, ``.s390x``, ``.ia64``, ``.armv7hl``/``-armmp``...;
3. ``proc/cpuinfo``: ``arch : IA-64``/``family : Itanium`` (ia64), ``vendor_id : IBM/S390``
   (s390x), ``cpu : POWERn``/``PPC970``/``Cell`` or ``platform`` with ``timebase`` (ppc64;
   ``MMU : Hash|Radix``), ``CPU implementer``/``Features`` (arm64; ``CPU architecture: 7`` or
   the 32-bit features ``half thumb`` make it 32-bit arm), ``vendor_id`` with ``flags`` (x86).
   For x86 the kernel's width comes from meminfo when it says (HighTotal above 0 or a
   VmallocTotal below 4 GiB: a 32-bit kernel; a VmallocTotal above 4 GiB or a MemTotal above
   PAE's 64 GiB: a 64-bit one), else from the CPU's ``lm`` flag;
4. the hugepage sizes alone (64 kB: arm64 4K; 32 MiB without 64 kB: arm64 16K; 512 MiB or
   16 GiB without 16 MiB: arm64 64K; 16 MiB: ppc64 hash; only 1 MiB: s390x; only 256 MiB:
   ia64), else x86_64, said to be assumed.

Within an architecture the sizes only pick what it leaves open (arm64's granule, ppc64's
MMU): a size the architecture does not register (a stray directory) never changes it and is
named in the note. An architecture umbp-sim does not model (ia64, 32-bit arm, ...) keeps its
name on the Machine and gets a note saying so and what the replay assumed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

MODELLED = ("x86_64", "i386", "arm64", "ppc64le", "ppc64", "s390x")
# uname -m -> the Machine's arch name
MACHINES = {
    "x86_64": "x86_64", "amd64": "x86_64", "i386": "i386", "i486": "i386", "i586": "i386",
    "i686": "i386", "aarch64": "arm64", "arm64": "arm64", "ppc64le": "ppc64le",
    "ppc64": "ppc64", "s390x": "s390x", "ia64": "ia64", "s390": "s390", "ppc": "ppc",
    "riscv64": "riscv64", "loongarch64": "loongarch64", "mips64": "mips64", "mips": "mips",
    "sparc64": "sparc64", "alpha": "alpha", "parisc": "parisc", "parisc64": "parisc",
}  # fmt: skip
# The base page an architecture's distribution kernels use (not modelled ones: the default).
DEFAULT_PAGE = {"ppc64le": 64 * KiB, "ppc64": 64 * KiB, "ia64": 16 * KiB,
                "loongarch64": 16 * KiB, "sparc64": 8 * KiB, "alpha": 8 * KiB}  # fmt: skip
# The sizes each modelled architecture's kernel registers (docs/kernel-model.md section 8).
_ARM64 = {4 * KiB: {64 * KiB, 2 * MiB, 32 * MiB, GiB}, 16 * KiB: {2 * MiB, 32 * MiB, GiB},
          64 * KiB: {2 * MiB, 512 * MiB, 16 * GiB}}  # fmt: skip
_PPC64 = {"hash": {16 * MiB, 16 * GiB}, "radix": {2 * MiB, GiB}}
_REGISTERED = {"x86_64": {2 * MiB, GiB}, "i386": {2 * MiB, 4 * MiB}, "s390x": {MiB, 2 * GiB}}

_D = r"(?:^|[.\-_+~])"  # a release's token boundary
_E = r"(?=$|[.\-_+~])"
# Kernel release tokens, most specific first.
_RELEASE_ARCH = [
    (re.compile(_D + r"(?:ppc64le|powerpc64le|ppc64el)" + _E), "ppc64le"),
    (re.compile(_D + r"(?:ppc64|powerpc64)" + _E), "ppc64"),
    (re.compile(_D + r"(?:x86_64|amd64)" + _E), "x86_64"),
    (re.compile(_D + r"(?:i[3-6]86|686(?:-pae)?$)" + _E), "i386"),
    (re.compile(_D + r"(?:aarch64|arm64)" + _E), "arm64"),
    (re.compile(_D + r"s390x" + _E), "s390x"),
    (re.compile(_D + r"(?:ia64|itanium|mckinley)" + _E), "ia64"),
    (re.compile(_D + r"(?:armv[4-7]\w*|armhf|armel|armmp(?:-lpae)?)" + _E), "arm"),
    (re.compile(_D + r"(?:riscv64|loongarch64|mips64\w*|sparc64)" + _E), None),
]
_TRIPLET = re.compile(
    r"\b(x86_64|i[3-6]86|aarch64|powerpc64le|powerpc64|s390x|ia64|riscv64|loongarch64|arm)"
    r"-[a-z0-9_]*-?linux[\w.+-]*"
)
_TRIPLET_ARCH = {"powerpc64le": "ppc64le", "powerpc64": "ppc64", "arm": "arm"}


@dataclass(frozen=True)
class ArchReading:
    """What the dump shows: ``arch`` (the Machine's name), base ``page_size``, the note that
    says why, whether umbp-sim models the architecture, and ppc64's MMU (else None)."""

    arch: str
    page_size: int
    note: str
    modelled: bool = True
    mmu: str | None = None


@dataclass
class ArchEvidence:
    """The texts the architecture is read from (None: not in the dump)."""

    sizes: list[int]
    cpuinfo: str | None = None
    meminfo: str | None = None  # proc/meminfo's text (HighTotal, VmallocTotal, MemTotal)
    kernel: list[tuple[str, str]] | None = None  # (text, where): osrelease, proc/version...
    recorded_machine: str | None = None  # the collector's uname -m
    recorded_page_size: int | None = None  # the collector's getconf PAGESIZE


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


def _sizes(sizes: set[int] | list[int]) -> str:
    return ", ".join(_size(s) for s in sorted(sizes))


def recorded(manifest: str | None) -> tuple[str | None, int | None]:
    """(uname -m, page size) from a collector manifest's ``machine`` and ``page_size`` keys;
    a value of the wrong shape is left out (the manifest's own checks are elsewhere)."""
    if manifest is None:
        return None, None
    try:
        doc = json.loads(manifest)
    except (ValueError, RecursionError):
        return None, None
    if not isinstance(doc, dict):
        return None, None
    machine = doc.get("machine")
    page = doc.get("page_size")
    if not (isinstance(machine, str) and re.fullmatch(r"[A-Za-z0-9_]{1,32}", machine)):
        machine = None
    if not (type(page) is int and 4 * KiB <= page <= MiB and page & (page - 1) == 0):
        page = None
    return machine, page


def machine_arch(machine: str) -> str:
    """A ``uname -m`` as the Machine's arch name (``aarch64`` -> ``arm64``)."""
    if machine in MACHINES:
        return MACHINES[machine]
    if machine.startswith("arm"):
        return "arm"
    return machine


def kernel_arch(text: str) -> tuple[str, str] | None:
    """(the architecture a kernel string names, the part that names it) for an osrelease, a
    ``proc/version`` (its release, else its compiler triplet) or a ``uname -a`` line; None
    when it names none."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    words = first.split()
    release = first
    if first.startswith("Linux version ") and len(words) >= 3:
        release = words[2]
    elif first.startswith("Linux ") and len(words) >= 3:  # uname -a
        for w in reversed(words[3:]):
            if w in MACHINES:
                return MACHINES[w], f"uname -a machine '{w}'"
        release = words[2]
    for pattern, arch in _RELEASE_ARCH:
        m = pattern.search(release)
        if m:
            return arch or m.group(0).strip(".-_+~"), f"kernel {release[:60]!r}"
    if first.startswith("Linux version "):
        m = _TRIPLET.search(first)
        if m:
            name = m.group(1)
            return _TRIPLET_ARCH.get(name) or MACHINES.get(name, name), (
                f"kernel built by {m.group(0)[:40]}"
            )
    return None


def _field(text: str, name: str) -> str | None:
    m = re.search(rf"^{name}\s*:\s*(.*?)\s*$", text, re.M)
    return m.group(1) if m else None


def _meminfo_kb(text: str | None, key: str) -> int | None:
    m = re.search(rf"^{re.escape(key)}:\s*([0-9]{{1,20}}) kB\s*$", text or "", re.M)
    return int(m.group(1)) if m else None


def cpuinfo_family(cpuinfo: str) -> tuple[str, str] | None:
    """(family, the line that says it) from proc/cpuinfo; family is ``ia64``, ``s390x``,
    ``ppc64``, ``ppc``, ``arm64``, ``arm`` or ``x86``; None when it says none of them."""
    arch = _field(cpuinfo, "arch")
    if arch and "IA-64" in arch:
        return "ia64", f"proc/cpuinfo 'arch : {arch[:40]}'"
    family = _field(cpuinfo, "family")
    if family and "Itanium" in family:
        return "ia64", f"proc/cpuinfo 'family : {family[:40]}'"
    vendor = _field(cpuinfo, "vendor_id")
    if vendor and "S390" in vendor:
        return "s390x", f"proc/cpuinfo 'vendor_id : {vendor[:40]}'"
    cpu = _field(cpuinfo, "cpu")
    if cpu and re.match(r"(?:POWER\d|PPC970|Cell Broadband|PA6T|RS64)", cpu):
        return "ppc64", f"proc/cpuinfo 'cpu : {cpu.split(',')[0][:40]}'"
    platform = _field(cpuinfo, "platform")
    if cpu and platform and _field(cpuinfo, "timebase"):
        return "ppc", f"proc/cpuinfo 'cpu : {cpu[:40]}', 'platform : {platform[:40]}'"
    features = _field(cpuinfo, "Features")
    implementer = _field(cpuinfo, "CPU implementer")
    if features is not None or implementer is not None:
        version = _field(cpuinfo, "CPU architecture") or ""
        words = set((features or "").split())
        if version.isdigit() and int(version) < 8 or words & {"half", "thumb", "swp"}:
            what = f"'CPU architecture: {version}'" if version else f"'Features : {features}'"
            return "arm", f"proc/cpuinfo {what[:60]}"
        return "arm64", "proc/cpuinfo " + (
            f"'CPU architecture: {version}'" if version else "'CPU implementer'"
        )
    if vendor is not None:
        return "x86", f"proc/cpuinfo 'vendor_id : {vendor[:40]}'"
    return None


def _x86_width(ev: ArchEvidence) -> tuple[str, str]:
    """i386 or x86_64 for an x86 CPU, and why: meminfo first (the kernel), then ``lm``."""
    high = _meminfo_kb(ev.meminfo, "HighTotal")
    vmalloc = _meminfo_kb(ev.meminfo, "VmallocTotal")
    total = _meminfo_kb(ev.meminfo, "MemTotal")
    if high:
        return "i386", f"meminfo HighTotal {high} kB (highmem: a 32-bit kernel)"
    if vmalloc is not None and vmalloc > 4 * MiB:
        return "x86_64", f"meminfo VmallocTotal {vmalloc} kB (a 64-bit kernel)"
    if vmalloc is not None:
        return "i386", f"meminfo VmallocTotal {vmalloc} kB (a 32-bit kernel)"
    if total is not None and total > 64 * MiB:
        return "x86_64", f"meminfo MemTotal {total} kB (more than a 32-bit kernel addresses)"
    flags = _field(ev.cpuinfo or "", "flags")
    if flags is not None and "lm" not in flags.split():
        return "i386", "flags lack 'lm'"
    return "x86_64", "flags have 'lm'" if flags else "64-bit assumed (nothing gives the width)"


def _sizes_alone(kb: set[int]) -> tuple[str, int | None, str] | None:
    """(arch, page size or None, why) from the hugepage sizes alone."""
    if 64 in kb:
        return "arm64", 4 * KiB, "64 kB is arm64's contiguous-PTE size"
    if 32768 in kb:
        return "arm64", 16 * KiB, "32 MiB without 64 kB is arm64's 16K granule"
    if kb & {524288, 16777216} and 16384 not in kb:
        return "arm64", 64 * KiB, "512 MiB or 16 GiB without 16 MiB is arm64's 64K granule"
    if 16384 in kb:
        return "ppc64le", None, "16 MiB is ppc64's hash MMU size"
    if kb and kb <= {1024, 2097152} and 1024 in kb:
        return "s390x", 4 * KiB, "1 MiB is s390x's"
    if kb == {262144}:
        return "ia64", None, "256 MiB alone is ia64's default"
    return None


def _arm64_granule(ev: ArchEvidence, sizes: set[int]) -> tuple[int, str]:
    kernels = " ".join(t for t, _ in ev.kernel or [])
    if re.search(r"[.\-_+~]64k\b", kernels):
        return 64 * KiB, "a 64k kernel"
    hits = {g: len(sizes & s) - len(sizes - s) for g, s in _ARM64.items()}
    if 64 * KiB in sizes and not sizes & {512 * MiB, 16 * GiB}:
        return 4 * KiB, "hugepage size 64 kB"
    if sizes & {512 * MiB, 16 * GiB} and 64 * KiB not in sizes:
        return 64 * KiB, "hugepage size 512 MiB or 16 GiB"
    if 32 * MiB in sizes and 64 * KiB not in sizes:
        return 16 * KiB, "hugepage size 32 MiB without 64 kB"
    if 64 * KiB in sizes:  # 64 kB with a 64K-granule size: the granule most sizes fit
        best = max(_ARM64, key=lambda g: (hits[g], -g))
        return best, "the granule most of the hugepage sizes fit"
    return 4 * KiB, "assumed, the hugepage sizes do not tell arm64's granule"


def _ppc64_mmu(ev: ArchEvidence, sizes: set[int]) -> tuple[str, str]:
    mmu = _field(ev.cpuinfo or "", "MMU")
    if mmu and mmu.lower() in _PPC64:
        return mmu.lower(), f"proc/cpuinfo 'MMU : {mmu}'"
    if sizes & _PPC64["hash"]:
        return "hash", "hugepage sizes " + _sizes(sizes & _PPC64["hash"])
    if sizes & _PPC64["radix"]:
        return "radix", "hugepage sizes " + _sizes(sizes & _PPC64["radix"])
    cpu = _field(ev.cpuinfo or "", "cpu") or ""
    m = re.match(r"POWER(\d+)", cpu)
    if cpu and (m is None or int(m.group(1)) < 9):
        return "hash", f"{cpu.split(',')[0][:20]} has no radix MMU"
    return "radix", "radix assumed (POWER9 and later boot with it)"


def read_arch(ev: ArchEvidence) -> ArchReading:
    """The architecture, base page size and the note saying why (module docstring)."""
    sizes = set(ev.sizes)
    kb = {s // KiB for s in sizes}
    arch: str | None = None
    why = ""
    page: int | None = None
    if ev.recorded_machine:
        arch = machine_arch(ev.recorded_machine)
        why = f"uname -m '{ev.recorded_machine}' recorded by the collector"
    for text, where in ev.kernel or []:
        if arch is not None:
            break
        named = kernel_arch(text)
        if named is not None:
            arch, why = named[0], f"{named[1]} ({where})"
    family = cpuinfo_family(ev.cpuinfo) if ev.cpuinfo and arch is None else None
    if family is not None:
        name, why = family
        if name == "x86":
            arch, width = _x86_width(ev)
            why = f"{why}, {width}"
        elif name == "ppc64":
            cpu = _field(ev.cpuinfo or "", "cpu") or ""
            m = re.match(r"POWER(\d+)", cpu)
            little = m is not None and int(m.group(1)) >= 8
            arch = "ppc64le" if little else "ppc64"
            why += (
                " (little-endian assumed, as distributions run POWER8 and later)"
                if little
                else " (big-endian assumed before POWER8)"
            )
        else:
            arch = name
    if arch is None:
        alone = _sizes_alone(kb)
        if alone is not None:
            arch, page, reason = alone
            why = f"the hugepage sizes alone ({reason})"
        else:
            arch = "x86_64"
            why = (
                "assumed (no proc/cpuinfo, kernel string or distinctive hugepage size)"
                if ev.cpuinfo is None
                else "assumed (proc/cpuinfo names no architecture umbp-sim knows)"
            )
    mmu = None
    extra = ""
    if ev.recorded_page_size:
        page = ev.recorded_page_size
        if ev.recorded_machine:
            why = f"uname -m '{ev.recorded_machine}' and page size {page} recorded by the collector"
        else:
            extra = f"; page size {page} recorded by the collector"
    if arch == "arm64" and page is None:
        page, granule = _arm64_granule(ev, sizes)
        extra = f"; {_size(page)} pages: {granule}"
    if arch in ("ppc64le", "ppc64"):
        mmu, mmu_why = _ppc64_mmu(ev, sizes)
        extra += f"; {mmu} MMU: {mmu_why}"
    if page is None:
        page = DEFAULT_PAGE.get(arch, 4 * KiB)
    registered = _registered(arch, page, mmu)
    if registered is not None and sizes - registered:
        extra += (
            f"; hugepage size(s) {_sizes(sizes - registered)} are not among those {arch} "
            f"registers ({_sizes(registered)}): kept as the dump lists them"
        )
    if arch not in MODELLED:
        page_from = "recorded by the collector" if ev.recorded_page_size else f"{arch}'s default"
        note = (
            f"architecture {arch} (from {why}) is not modelled: replayed with {_size(page)} "
            f"pages ({page_from}) and the hugepage sizes the dump lists, under the rules "
            "umbp-sim models for x86_64 and arm64"
        )
        return ArchReading(arch, page, note, modelled=False)
    return ArchReading(arch, page, f"page size {_size(page)}, {arch}: {why}{extra}", mmu=mmu)


def _registered(arch: str, page: int, mmu: str | None) -> set[int] | None:
    if arch == "arm64":
        return _ARM64.get(page)
    if arch in ("ppc64le", "ppc64"):
        return _PPC64.get(mmu or "radix")
    return _REGISTERED.get(arch)
