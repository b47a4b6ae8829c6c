# ruff: noqa: E501  (the tables keep each hostile value and its one line on one line)
"""Absurd values and wrong types (issue 26, points 6 and 7): one line naming the file and key,
exit 65 for data and 64 for usage, never 70; bounded work and bounded messages."""

from __future__ import annotations

import re
import resource
import textwrap
import time
from pathlib import Path

import pytest

from umbp_sim import cli
from umbp_sim.machine import Machine, MachineError
from umbp_sim.vocabulary.bounded import short_list, shown

BASE = {
    "scenario": 'name = "x"\ndescription = "x"\n',
    "machine": 'nodes = 2\nhugepages = { "2MiB" = 8 }\n',
    "request": 'size = "4MiB"\nbacking = "AnonymousHugetlb"\n',
    "expect": 'outcome = "ok"\n',
}


def scenario(tmp_path: Path, top: str = "", **tables: str) -> Path:
    """A valid scenario with lines added to its tables (``machine="arch = 1"``)."""
    parts = [top]
    for name, body in BASE.items():
        extra = tables.pop(name, "")
        keys = {line.split("=")[0].strip() for line in extra.splitlines()}
        kept = "".join(
            f"{line}\n" for line in body.splitlines() if line.split("=")[0].strip() not in keys
        )
        parts.append(f"[{name}]\n{kept}{extra}\n")
    assert not tables
    p = tmp_path / "s.toml"
    p.write_text("".join(parts))
    return p


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        rc = cli.main(list(argv))
    except SystemExit as e:
        rc = int(e.code or 0)
    return rc, capsys.readouterr().err


# ---- point 7: wrong types, refused naming the key ----------------------------------------------

TYPED = [
    # [machine]: each Machine field and build keyword by its declared type
    ("machine", "arch = 1", "[machine].arch: expected a string, got an integer (1)"),
    ("machine", 'nodes = "2"', "[machine].nodes: expected an integer, got a string ('2')"),
    ("machine", "nodes = 1.5", "[machine].nodes: expected an integer, got a float (1.5)"),
    ("machine", "page_size = 4096.0", "[machine].page_size: expected a size (bytes, or a string such as '2MiB'), got a float (4096.0)"),
    ("machine", 'hugepages = { "2MiB" = 1.5 }', "[machine].hugepages.2MiB: expected an integer, got a float (1.5)"),
    ("machine", "hugepages = 5", "[machine].hugepages: expected a table, got an integer (5)"),
    ("machine", "hugepages_per_node = [1, 2]", "[machine].hugepages_per_node[0]: expected a table, got an integer (1)"),
    ("machine", "overcommit_memory = 1.0", "[machine].overcommit_memory: expected an integer, got a float (1.0)"),
    ("machine", 'overcommit_ratio = "50"', "[machine].overcommit_ratio: expected an integer, got a string ('50')"),
    ("machine", "admin_reserve_kbytes = 1.5", "[machine].admin_reserve_kbytes: expected an integer, got a float (1.5)"),
    ("machine", "kernel_version = 5.15", "[machine].kernel_version: expected a string, got a float (5.15)"),
    ("machine", 'mem_available_line = "yes"', "[machine].mem_available_line: expected true or false, got a string ('yes')"),
    ("machine", "numa_sysfs = 1", "[machine].numa_sysfs: expected true or false, got an integer (1)"),
    ("machine", 'root = "true"', "[machine].root: expected true or false, got a string ('true')"),
    ("machine", "name = 5", "[machine].name: expected a string, got an integer (5)"),
    ("machine", 'possible_nodes = [0, "1"]', "[machine].possible_nodes[1]: expected an integer, got a string ('1')"),
    ("machine", 'hugepages_reserved = { "2MiB" = 1.5 }', "[machine].hugepages_reserved.2MiB: expected an integer, got a float (1.5)"),
    ("machine", "free_hugepages_per_node = [1, 2]", "[machine].free_hugepages_per_node[0]: expected a table, got an integer (1)"),
    ("machine", "watermark_low = 100000000000000000000", "[machine].watermark_low: 100000000000000000000 bytes is beyond what the simulator holds (below 2^62 bytes)"),
    # [request] and [expect]
    ("request", "numa_node = 2147483648", "[request].numa_node: must be in -2,147,483,648..2,147,483,647, got 2147483648"),
    ("request", "size = 100000000000000000000", "[request].size: 100000000000000000000 bytes is beyond what the simulator holds (below 2^62 bytes)"),
    ("expect", 'no_leaks = "true"', "[expect].no_leaks: expected true or false, got a string ('true')"),
    ("expect", 'no_warnings = "yes"', "[expect].no_warnings: expected true or false, got a string ('yes')"),
    ("expect", 'mapped_size = "x"', "[expect].mapped_size: cannot read size 'x' (use bytes or a unit: KiB, MiB, GiB, TiB (binary); KB, MB, GB, TB (decimal); kB as the kernel writes it)"),
    ("expect", "error = 5", "[expect].error: expected a string, got an integer (5)"),
    ("expect", 'crash_node = "1"', "[expect].crash_node: expected an integer, got a string ('1')"),
    ("expect", "steps = [1]", "[expect].steps[0]: expected a string, got an integer (1)"),
]  # fmt: skip


@pytest.mark.parametrize(("table", "line", "message"), TYPED, ids=[t[1] for t in TYPED])
def test_wrong_types_name_the_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, table: str, line: str, message: str
) -> None:
    p = scenario(tmp_path, **{table: line + "\n"})
    assert run(capsys, "run", str(p)) == (65, f"umbp-sim run: {p}: {message}\n")


FAULTS = [
    ("nth = 100000000000000000000000", "faults[0].nth: 100000000000000000000000 does not fit in 64 bits"),
    ("min_length = 100000000000000000000000", "faults[0].min_length: 100000000000000000000000 does not fit in 64 bits"),
    ("every = 18446744073709551616", "faults[0].every: 18446744073709551616 does not fit in 64 bits"),
    ("max_fires = 18446744073709551616", "faults[0].max_fires: 18446744073709551616 does not fit in 64 bits"),
    ("calls = [1, 18446744073709551616]", "faults[0].calls: 18446744073709551616 does not fit in 64 bits"),
]  # fmt: skip


@pytest.mark.parametrize(("rule", "message"), FAULTS, ids=[f[0] for f in FAULTS])
def test_oversized_fault_rule_numbers(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, rule: str, message: str
) -> None:
    p = scenario(tmp_path, f'faults = [{{ op = "mmap", errno = "ENOMEM", {rule} }}]\n')
    assert run(capsys, "run", str(p)) == (65, f"umbp-sim run: {p}: {message}\n")


def test_python_api_refuses_wrong_types_before_any_work() -> None:
    cases = [
        (dict(arch=1), "arch: expected a string, got an integer (1)"),
        (dict(nodes=10**9), "nodes: must be in 1..1,024, got 1000000000"),
        (dict(hugepages={"2MiB": "8"}), "hugepages.2MiB: expected an integer, got a string ('8')"),
        (dict(root="true"), "root: expected true or false, got a string ('true')"),
    ]
    for kw, message in cases:
        start = time.process_time()
        with pytest.raises(MachineError) as e:
            Machine.build(**kw)  # type: ignore[arg-type]
        assert str(e.value) == message
        assert time.process_time() - start < 0.5
    m = Machine()
    m.kernel_version = 5  # type: ignore[assignment]
    with pytest.raises(
        MachineError, match=r"^kernel_version: expected a string, got an integer \(5\)$"
    ):
        m.validate()
    m = Machine()
    m.nodes = [m.nodes[0]] * 3
    with pytest.raises(MachineError, match=r"^nodes: duplicate node id 0 in 0, 0, 0$"):
        m.validate()


def test_fault_rule_api_bounds() -> None:
    from umbp_sim.faults import FaultPlan, FaultPlanError, FaultRule

    with pytest.raises(
        FaultPlanError, match=r"^fault rule\.nth: 18446744073709551616 does not fit in 64 bits$"
    ):
        FaultRule(op="mmap", errno="ENOMEM", nth=2**64)
    with pytest.raises(
        FaultPlanError,
        match=r"^faults\[0\]\.min_length: a 5001-digit integer does not fit in 64 bits$",
    ):
        FaultPlan.from_rules([{"op": "mmap", "errno": "ENOMEM", "min_length": 10**5000}])


def test_bad_alloc_under_the_default_profile_is_an_outcome(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The documented fault: mori lets std::bad_alloc escape alloc; the server dies of it."""
    p = scenario(tmp_path, 'faults = [{ op = "mmap", throw = "bad_alloc" }]\n')
    p.write_text(
        p.read_text().replace(
            'outcome = "ok"', 'outcome = "failed"\nerror = "MemoryError: std::bad_alloc"'
        )
    )
    rc, err = run(capsys, "run", str(p))
    assert (rc, err) == (0, "")
    steps = 'kind = "steps"\nsteps = [{ op = "alloc", id = "a", size = 4096 }]\n'
    p.write_text(p.read_text().replace('size = "4MiB"\nbacking = "AnonymousHugetlb"\n', steps))
    p.write_text(
        p.read_text().replace(
            'error = "MemoryError', 'steps = ["alloc raised MemoryError"]\nerror = "MemoryError'
        )
    )
    assert run(capsys, "run", str(p)) == (0, "")


# ---- point 7: what tomllib cannot hold, and the pytest plugin ----------------------------------


def test_toml_nesting_and_long_numbers_are_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    p = scenario(tmp_path, "x = " + "[" * 5000 + "]" * 5000 + "\n")
    assert run(capsys, "run", str(p)) == (
        65, f"umbp-sim run: {p}: invalid TOML: arrays or tables nested too deeply to read\n"
    )  # fmt: skip
    p = scenario(tmp_path, request="numa_node = 1" + "0" * 5000 + "\n")
    rc, err = run(capsys, "run", str(p))
    assert rc == 65 and err.startswith(
        f"umbp-sim run: {p}: invalid TOML: a number too long to read"
    )
    assert len(err) < 250


def test_a_bad_scenario_file_is_one_failed_test(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", deep="umbp_sim_scenario = 1\nx = " + "[" * 5000 + "]" * 5000 + "\n")
    pytester.makepyfile(test_other="def test_other():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        ["*deep.toml: invalid TOML: arrays or tables nested too deeply to read*"]
    )


# ---- point 7: regexes ----------------------------------------------------------------------------

FAILED_EXPECT = 'outcome = "failed"\n'


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("(a+)+$", "a quantifier inside a repeated group can backtrack without bound"),
        ("(.*a){25}", "a quantifier inside a repeated group can backtrack without bound"),
        ("(a|ab)*c", "an alternation (|) inside a repeated group can backtrack without bound"),
        ("x" * 1001, "1,001 characters; at most 1,000"),
    ],
)
def test_backtracking_regexes_refused_when_read(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, pattern: str, why: str
) -> None:
    p = scenario(tmp_path, expect=f"error_regex = '{pattern}'\n")
    rc, err = run(capsys, "run", str(p))
    assert rc == 65
    assert err.startswith(f"umbp-sim run: {p}: [expect].error_regex: {why}")


def test_a_slow_regex_match_is_bounded(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """No nested repeat, but n^4 on the error text: stopped at its CPU bound, one line."""
    p = scenario(tmp_path, 'faults = [{ op = "mmap", errno = "ENOMEM" }]\n')
    text = p.read_text().replace(
        'outcome = "ok"', 'outcome = "failed"\nerror_regex = ".*.*.*.*.*Z"'
    )
    p.write_text(text.replace('backing = "AnonymousHugetlb"', 'backing = "Anonymous"'))
    start = time.process_time()
    rc, err = run(capsys, "run", str(p))
    assert time.process_time() - start < 5
    assert rc == 65
    assert re.fullmatch(
        rf"umbp-sim run: {re.escape(str(p))}: \[expect\]\.error_regex: matching took more than 1 s of CPU on a \d+-character error \(the pattern backtracks: fewer wildcards such as \.\* in a row\)\n",
        err,
    ), err


# ---- point 7: --error, dumps -------------------------------------------------------------------

LINE = "RuntimeError: UMBPHostMemAllocator.alloc({s} bytes) failed (requested_backing=UMBPHostBufferBacking.{b}, numa_node={n})."


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (LINE.format(s="9" * 5000, b="Anonymous", n=0), "--error: 99999999999999999999...(5,000 digits) bytes does not fit a size_t"),
        (LINE.format(s="1", b="Anonymous", n="-" + "9" * 5000), "--error: numa_node=-9999999999999999999...(5,001 digits) does not fit an int"),
        (LINE.format(s="1", b="X" * 10**5, n=0), "--error: requested_backing=XXXXXXXXXXXXXXXXXXXXXXXXXXXXXX...(100,000 characters) is not one of Anonymous, AnonymousHugetlb, AnonymousShm, AnonymousShmHugetlb"),
        ("\n".join(LINE.format(s=i, b="Anonymous", n=0) for i in range(10**4)), "--error: 10,000 different failed allocations in it (alloc(0 bytes) Anonymous node 0; alloc(1 bytes) Anonymous node 0; alloc(10 bytes) Anonymous node 0; ... (9,997 more)): give the one to replay"),
    ],
    ids=["size-5000-digits", "node-5000-digits", "backing-100k", "10k-lines"],
)  # fmt: skip
def test_error_lines_beyond_int(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, line: str, message: str
) -> None:
    dump = tmp_path / "meminfo"
    dump.write_text("MemTotal: 16777216 kB\nMemFree: 8388608 kB\n")
    assert run(capsys, "replay", str(dump), "--error", line) == (
        64,
        f"umbp-sim replay: {message}\n",
    )


@pytest.mark.parametrize("low", ["99999999999999999999999", "1" + "0" * 5000])
def test_zoneinfo_low_beyond_64_bits(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, low: str
) -> None:
    (tmp_path / "h" / "proc").mkdir(parents=True)
    (tmp_path / "h" / "proc" / "meminfo").write_text("MemTotal: 16777216 kB\nMemFree: 8388608 kB\n")
    (tmp_path / "h" / "proc" / "zoneinfo").write_text(f"Node 0, zone Normal\n        low {low}\n")
    rc, err = run(capsys, "replay", str(tmp_path / "h"), "--size", "1GiB")
    assert rc == 65
    assert err == (
        f"umbp-sim replay: {tmp_path / 'h'}/proc/zoneinfo:2: low {shown(low)}: the low "
        "watermarks are beyond what umbp-sim simulates (below 2^62 bytes)\n"
    )


# ---- point 6: bounded work and messages for absurd sizes and counts -----------------------------


def test_absurd_node_counts_are_bounded(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for n in (10**6, 10**9):
        p = scenario(tmp_path)
        p.write_text(p.read_text().replace("nodes = 2", f"nodes = {n}"))
        start = time.process_time()
        rc, err = run(capsys, "run", str(p))
        assert time.process_time() - start < 1
        assert (rc, err) == (
            65,
            f"umbp-sim run: {p}: [machine].nodes: must be in 1..1,024, got {n}\n",
        )


def test_pool_larger_than_its_node(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A dump claiming 2^40 hugepages on a 16 GiB node: the text replay draws 40-cell bars."""
    pages = str(1 << 40)
    files = {
        "proc/meminfo": f"MemTotal: 16777216 kB\nMemFree: 8388608 kB\nHugePages_Total: {pages}\nHugePages_Free: {pages}\nHugepagesize: 2048 kB\n",
        "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages": pages,
        "sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages": pages,
        "sys/devices/system/node/online": "0",
        "sys/devices/system/node/possible": "0",
        "sys/devices/system/node/node0/meminfo": "Node 0 MemTotal: 16777216 kB\nNode 0 MemFree: 8388608 kB\n",
        "sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages": pages,
        "sys/devices/system/node/node0/hugepages/hugepages-2048kB/free_hugepages": pages,
    }
    for rel, text in files.items():
        (tmp_path / "h" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "h" / rel).write_text(text + "\n")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.process_time()
    assert cli.main(["replay", str(tmp_path / "h"), "--size", "1GiB"]) == 0
    assert time.process_time() - start < 5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 * 1024
    out = capsys.readouterr().out
    bar = next(line for line in out.splitlines() if line.startswith("  node 0"))
    assert bar.startswith(
        "  node 0  [" + "#" * 40 + "]  2 MiB pool 2097152.0 TiB free of 2097152.0 TiB"
    )


def test_values_are_shown_bounded() -> None:
    assert shown(10**5000) == "a 5001-digit integer"
    assert shown(-(10**30)) == "a negative 31-digit integer"
    assert shown("x" * 10**6) == "'" + "x" * 40 + "'... (1000000 characters)"
    assert shown(list(range(10**6))) == "[0, 1, 2, 3, ...]"
    nested: list[object] = []
    for _ in range(500):
        nested = [nested]
    assert shown(nested) == "[[[...]]]"
    assert short_list(range(10**6)) == "0, 1, 2, 3, 4, 5, 6, 7, ... (999,992 more)"


def test_unknown_keys_and_long_keys_are_bounded(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    key = "k" * 10**5
    p = scenario(tmp_path, expect=f'counters = {{ "{key}" = 1 }}\n')
    rc, err = run(capsys, "run", str(p))
    assert rc == 65 and len(err) < 300, err
    p = scenario(tmp_path, machine=textwrap.dedent(f'"{key}" = 1\n'))
    rc, err = run(capsys, "run", str(p))
    assert rc == 65 and len(err) < 1500, err
