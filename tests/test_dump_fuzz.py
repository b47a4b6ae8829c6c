"""Fuzz the dump reader: whatever the bytes, only DumpError may escape.

All runs parse in memory (bytes, in-memory tarballs, MemorySource trees). The "dump-fuzz"
settings profile gives each of the four tests 2500 examples: 10^4 in total per CI run.
Set UMBP_DUMP_FUZZ_EXAMPLES to change the per-test count.
"""

from __future__ import annotations

import io
import os
import tarfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
    max_examples=int(os.environ.get("UMBP_DUMP_FUZZ_EXAMPLES", "2500")),
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


def only_dump_errors(src: object) -> None:
    try:
        machine, facts = load_dump(src)  # type: ignore[arg-type]
    except DumpError as e:
        assert "\n" not in str(e)
        return
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
