"""Fuzz the dump reader: whatever the bytes, only DumpError may escape.

All runs parse in memory (bytes, in-memory tarballs, MemorySource trees). In the default test
run this is a smoke test: the "dump-fuzz" settings profile gives each of the first four tests
100 examples (UMBP_DUMP_FUZZ_EXAMPLES); ``test_hostile_archive_structure`` draws 10 archives
(UMBP_DUMP_FUZZ_ARCHIVES) of hostile members (pax and GNU long-name headers, huge declared
sizes, links, sparse and unknown types, bad checksums) and reads each in five packings, whole
and cut four ways: 25 inputs each. ``tox -e dumpfuzz`` (run by CI) gives the four tests 2,500
examples each, draws 4,000 archives and requires >= 10^5 inputs in all
(UMBP_DUMP_FUZZ_MIN_INPUTS). Every input must be answered within 5 s of CPU, and the peak
RSS may not grow by 256 MiB over the module (checked when it ends).
"""

from __future__ import annotations

import bz2
import io
import lzma
import os
import resource
import tarfile
import time
import zlib
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from umbp_sim.dump import DumpError, MemorySource, load_dump, parse_meminfo, parse_node_meminfo
from umbp_sim.dump.parse import (
    parse_cgroup_max,
    parse_distance,
    parse_int,
    parse_limits,
    parse_nodelist,
)

settings.register_profile(
    "dump-fuzz",
    max_examples=int(os.environ.get("UMBP_DUMP_FUZZ_EXAMPLES", "100")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FUZZ = settings.get_profile("dump-fuzz")

GOOD = {
    "proc/meminfo": (
        "MemTotal:       16777216 kB\nMemFree:        8388608 kB\nMemAvailable:   9000000 kB\n"
        "SwapTotal:            0 kB\nCommitLimit:    6291456 kB\nCommitted_AS:     62864 kB\n"
        "HugePages_Total:    1000\nHugePages_Free:      900\nHugePages_Rsvd:       10\n"
        "HugePages_Surp:        0\nHugepagesize:       2048 kB\nHugetlb:         2048000 kB\n"
    ),
    "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages": "1000\n",
    "sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages": "900\n",
    "sys/kernel/mm/hugepages/hugepages-2048kB/resv_hugepages": "10\n",
    "sys/kernel/mm/hugepages/hugepages-2048kB/surplus_hugepages": "0\n",
    "sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages": "2\n",
    "sys/devices/system/node/online": "0-1\n",
    "sys/devices/system/node/possible": "0-1\n",
    "sys/devices/system/node/has_memory": "0-1\n",
    "sys/devices/system/node/node0/meminfo": "Node 0 MemTotal: 8388608 kB\nNode 0 MemFree: 1 kB\n",
    "sys/devices/system/node/node1/meminfo": "Node 1 MemTotal: 8388608 kB\nNode 1 MemFree: 1 kB\n",
    "sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages": "600\n",
    "sys/devices/system/node/node0/hugepages/hugepages-2048kB/free_hugepages": "500\n",
    "sys/devices/system/node/node1/hugepages/hugepages-1048576kB/nr_hugepages": "2\n",
    "sys/devices/system/node/node1/distance": "21 10\n",
    "proc/sys/vm/overcommit_memory": "0\n",
    "proc/sys/kernel/osrelease": "6.1.0\n",
    "proc/self/limits": (
        "Limit                     Soft Limit           Hard Limit           Units     \n"
        "Max address space         unlimited            unlimited            bytes     \n"
    ),
    "sys/fs/cgroup/memory.max": "max\n",
    "sys/fs/cgroup/hugetlb.2MB.max": "4194304\n",
    # sosreports (dump/sosreport.py) and collect's manifest (dump/manifest.py)
    "sos_commands/kernel/sysctl_-a": "vm.overcommit_memory = 1\nkernel.osrelease = 5.15.0\n",
    "sos_commands/kernel/uname_-a": "Linux h 5.15.0 #1 SMP x86_64 GNU/Linux\n",
    "sos_commands/host/hostname": "h\n",
    "umbp-sim-collect.json": '{"files": {"proc/meminfo": 319, "proc/sys/vm/overcommit_memory": 2}}',
}

numbers = st.one_of(
    st.integers(0, 10),
    st.integers(0, 1 << 70),
    st.sampled_from([0, 1, 2**63, 2**64 - 1, 2**64, 10**40]),
)


@st.composite
def mutated_text(draw: st.DrawFn, base: str) -> str:
    """The base file, cut, with lines dropped, numbers replaced, or bytes spliced in."""
    lines = base.split("\n")
    op = draw(st.sampled_from(["cut", "drop", "number", "splice", "random", "same"]))
    if op == "cut":
        return base[: draw(st.integers(0, len(base)))]
    if op == "drop" and lines:
        i = draw(st.integers(0, len(lines) - 1))
        return "\n".join(lines[:i] + lines[i + 1 :])
    if op == "number":
        n = draw(numbers)
        return "".join(c if not c.isdigit() else "" for c in base[:10]) + str(n) + base[10:]
    if op == "splice":
        i = draw(st.integers(0, len(base)))
        return base[:i] + draw(st.text(max_size=12)) + base[i:]
    if op == "random":
        return draw(st.text(max_size=80))
    return base


@st.composite
def dump_trees(draw: st.DrawFn) -> dict[str, bytes]:
    keep = draw(st.sets(st.sampled_from(sorted(GOOD)), min_size=1))
    files = {}
    for rel in keep:
        text = draw(mutated_text(GOOD[rel])) if draw(st.booleans()) else GOOD[rel]
        files[rel] = (
            text.encode("utf-8", "surrogatepass")
            if draw(st.booleans())
            else (text.encode("utf-8", "replace"))
        )
    return files


PER_INPUT_SECONDS = 5.0
PEAK_GROWTH_KIB = 256 * 1024
INPUTS = [0]  # inputs answered in this process
SLOWEST = [0.0]  # seconds, the slowest of them


@pytest.fixture(scope="module", autouse=True)
def peak_memory() -> Iterator[None]:
    """ru_maxrss is a high-water mark: its growth over the module bounds every input's peak
    (meaningful in its own process, as ``tox -e dumpfuzz`` runs it)."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    yield
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown < PEAK_GROWTH_KIB, f"peak RSS grew by {grown} KiB while fuzzing the reader"
    want = int(os.environ.get("UMBP_DUMP_FUZZ_MIN_INPUTS", "0"))
    print(
        f"\ndump fuzz: {INPUTS[0]} inputs, slowest {SLOWEST[0]:.3f} s, peak RSS growth {grown} KiB"
    )
    assert INPUTS[0] >= want, f"{INPUTS[0]} inputs answered, the figure is {want}"


def only_dump_errors(src: object) -> None:
    INPUTS[0] += 1
    start = time.process_time()  # CPU seconds: the work, whatever else the machine runs
    try:
        machine, facts = load_dump(src)  # type: ignore[arg-type]
    except DumpError as e:
        assert "\n" not in str(e)
        return
    finally:
        elapsed = time.process_time() - start
        SLOWEST[0] = max(SLOWEST[0], elapsed)
        assert elapsed < PER_INPUT_SECONDS, f"{elapsed:.1f} s for one input"
    machine.validate()
    facts.to_json()


@FUZZ
@given(st.binary(max_size=400))
def test_random_bytes_as_dump(data: bytes) -> None:
    only_dump_errors(data)


@FUZZ
@given(dump_trees())
def test_random_file_subsets_and_mutations(files: dict[str, bytes]) -> None:
    only_dump_errors(MemorySource(files, "fuzz", "fuzz"))


@FUZZ
@given(dump_trees(), st.sampled_from(["w", "w:gz"]), st.integers(0, 4000), st.booleans())
def test_tarballs_whole_and_truncated(files: dict[str, bytes], mode: str, cut: int, do_cut: bool):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:  # type: ignore[call-overload]
        for rel, data in files.items():
            info = tarfile.TarInfo(f"H/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    only_dump_errors(raw[:cut] if do_cut else raw)


SINGLE = [
    (lambda t: parse_meminfo(t, "m"), GOOD["proc/meminfo"]),
    (lambda t: parse_node_meminfo(t, 0, "n"), GOOD["sys/devices/system/node/node0/meminfo"]),
    (lambda t: parse_int(t, "i"), "1000\n"),
    (lambda t: parse_nodelist(t, "l"), "0,2-3\n"),
    (lambda t: parse_distance(t, "d"), "10 21\n"),
    (lambda t: parse_limits(t, "x"), GOOD["proc/self/limits"]),
    (lambda t: parse_cgroup_max(t, "c"), "max\n"),
]


@FUZZ
@given(st.integers(0, len(SINGLE) - 1), st.data())
def test_single_file_parsers(which: int, data: st.DataObject) -> None:
    parser, base = SINGLE[which]
    text = data.draw(mutated_text(base))
    try:
        parser(text)
    except DumpError as e:
        assert "\n" not in str(e)


# ---- archive structure ---------------------------------------------------------------------

KINDS = [b"0", b"\0", b"1", b"2", b"3", b"5", b"6", b"7", b"L", b"K", b"x", b"g", b"S", b"V"]
NAMES = [f"H/{rel}" for rel in GOOD] + ["H/proc/meminfo", "proc/meminfo", "../H/proc/meminfo",
                                        "/etc/shadow", "H/../../x", "H/" + "d/" * 60]  # fmt: skip


def _octal(n: int, width: int) -> bytes:
    if 0 <= n < 8 ** (width - 1):
        return b"%0*o\0" % (width - 1, n)
    return b"\x80" + (n % 256 ** (width - 1)).to_bytes(width - 1, "big")  # GNU base-256


@st.composite
def raw_member(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(KINDS))
    name = draw(st.one_of(st.sampled_from(NAMES), st.text(max_size=120))).encode(
        "utf-8", "surrogateescape"
    )
    link = draw(st.one_of(st.sampled_from(NAMES + [""]), st.text(max_size=20))).encode(
        "utf-8", "surrogateescape"
    )
    if kind in (b"x", b"g"):
        records = draw(st.lists(st.sampled_from([b"path", b"linkpath", b"size", b"GNU.sparse"])
                                .flatmap(lambda k: st.tuples(st.just(k), st.one_of(
                                    st.sampled_from([n.encode() for n in NAMES]),
                                    st.binary(max_size=20)))), max_size=3))  # fmt: skip
        body = b"".join(b"%d %s=%s\n" % (len(k) + len(v) + 4 + 2, k, v) for k, v in records)
        if draw(st.booleans()):
            body = draw(st.binary(max_size=60))
    elif kind in (b"L", b"K"):
        body = draw(st.sampled_from([n.encode() for n in NAMES])) + b"\0"
    else:
        body = draw(st.one_of(st.just(GOOD["proc/meminfo"].encode()), st.binary(max_size=200)))
    huge = st.sampled_from([2**31, 2**33, 2**40, 2**62, 8**11 - 1])
    declared = draw(st.one_of(st.just(len(body)), st.integers(0, 3000), huge))
    block = bytearray(512)
    block[0:100] = name[:100].ljust(100, b"\0")
    block[100:108] = b"0000644\0"
    block[124:136] = _octal(declared, 12)
    block[156:157] = kind
    block[157:257] = link[:100].ljust(100, b"\0")
    block[257:265] = draw(st.sampled_from([b"ustar  \0", b"ustar\x0000", bytes(8)]))
    if kind == b"S" and draw(st.booleans()):
        block[482] = 1  # "extended sparse headers follow"
    block[148:156] = b" " * 8
    checksum = sum(block) if draw(st.integers(0, 9)) else draw(st.integers(0, 99999))
    block[148:156] = b"%06o\0 " % (checksum % 8**6)
    data = body[: min(len(body), declared)] if declared < 2**31 else body
    return bytes(block) + data + bytes(-len(data) % 512)


@st.composite
def hostile_tars(draw: st.DrawFn) -> tuple[bytes, list[int]]:
    """Raw tar bytes of hostile members, and where to cut each packed form."""
    raw = b"".join(draw(st.lists(raw_member(), min_size=1, max_size=6)))
    if draw(st.booleans()):
        raw += bytes(1024)  # end-of-archive blocks
    cuts = draw(st.lists(st.floats(0, 1), min_size=CUTS, max_size=CUTS))
    return raw, [int(c * 1e6) for c in cuts]


CUTS = 4  # truncated copies of each packed form
PACKINGS = 5  # tar, gzip, bzip2, xz, two gzip members + junk
INPUTS_PER_ARCHIVE = PACKINGS * (1 + CUTS)


def packed(raw: bytes) -> list[bytes]:
    half = len(raw) // 2
    gz = [zlib.compressobj(1, zlib.DEFLATED, 31) for _ in range(3)]
    return [
        raw,
        gz[0].compress(raw) + gz[0].flush(),
        bz2.compress(raw, 1),
        lzma.compress(raw, format=lzma.FORMAT_XZ, preset=0),
        gz[1].compress(raw[:half])
        + gz[1].flush()
        + gz[2].compress(raw[half:])
        + gz[2].flush()
        + b"\x1f\x8bjunk",
    ]


# Drawn archives: 200 (5,000 inputs) in the plain run; tox -e dumpfuzz draws 4,000 (10^5).
ARCHIVES = settings(FUZZ, max_examples=int(os.environ.get("UMBP_DUMP_FUZZ_ARCHIVES", "10")))


@ARCHIVES
@given(hostile_tars())
def test_hostile_archive_structure(tar_and_cuts: tuple[bytes, list[int]]) -> None:
    """Each drawn archive is read whole and cut, in each packing: INPUTS_PER_ARCHIVE inputs."""
    raw, cuts = tar_and_cuts
    for data in packed(raw):
        only_dump_errors(data)
        for cut in cuts:
            only_dump_errors(data[: cut % (len(data) + 1)])
