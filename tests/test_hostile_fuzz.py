# ruff: noqa: E501  (the value and flag tables keep one kind per line)
"""Fuzz scenario files, the command line, compare --merge's shard files, build-allocator's paths
and limits, the Python API and the external protocols' frames: bad input is one line, never a
traceback or exit 70 (issues 26, 43).

Everything runs in this process: ``umbp-sim run FILE`` and ``umbp-sim replay``/``preflight
--root`` through ``cli.main`` (argparse's usage errors caught as SystemExit), ``Machine.build``
and ``FaultPlan.from_rules`` directly, and a frame an allocator or a program under ``exec``
could write through the protocols' readers (``procs.loads``, the checks of a server's messages,
``evidence.EvidenceReader``). Each drawn hostile value is put under several keys, so one
hypothesis example is several inputs (counted in ``INPUTS``). The plain run is small (a few
hundred inputs, UMBP_HOSTILE_FUZZ_EXAMPLES per test); ``tox -e hostilefuzz`` (run by CI) draws
more and requires >= 10^5 inputs (UMBP_HOSTILE_FUZZ_MIN_INPUTS). Every input must be answered
within 5 s of CPU, and the peak RSS may not grow by 256 MiB over the module.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import math
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from umbp_sim import cli
from umbp_sim.faults import FaultPlan, FaultPlanError, FaultRule
from umbp_sim.machine import SCENARIO_MACHINE_KEYS, Machine, MachineError

settings.register_profile(
    "hostile-fuzz",
    max_examples=int(os.environ.get("UMBP_HOSTILE_FUZZ_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FUZZ = settings.get_profile("hostile-fuzz")
# How many keys each drawn value is put under (inputs per example).
KEYS_PER_VALUE = int(os.environ.get("UMBP_HOSTILE_FUZZ_KEYS", "4"))

PER_INPUT_SECONDS = 5.0
PEAK_GROWTH_KIB = 256 * 1024
INPUTS = [0]
SLOWEST = [0.0]
EXITS: dict[int, int] = {}


@pytest.fixture(scope="module", autouse=True)
def peak_memory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    # What one-time imports take (torch for an sglang request: ~200 MiB) is not the fuzz's:
    # run one valid scenario of each kind and one replay before the baseline.
    warm = tmp_path_factory.mktemp("warm")
    kinds = [(("machine", "nodes"), 2)]
    if importlib.util.find_spec("torch") is not None:  # `tox -e notorch`: an sglang one is 65
        kinds.append((("sglang", "layers"), 2))
    for slot, value in kinds:
        (warm / "w.toml").write_text(scenario_text(slot, value))
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            assert cli.main(["run", str(warm / "w.toml")]) in (0, 1)
    (warm / "meminfo").write_text("MemTotal: 16777216 kB\nMemFree: 8388608 kB\n")
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["replay", str(warm / "meminfo"), "--size", "1GiB"]) == 0
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.process_time()
    yield
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(
        f"\nhostile fuzz: {INPUTS[0]} inputs in {time.process_time() - start:.1f} s of CPU, "
        f"slowest {SLOWEST[0]:.3f} s, peak RSS growth {grown} KiB, exits {sorted(EXITS.items())}"
    )
    assert grown < PEAK_GROWTH_KIB, f"peak RSS grew by {grown} KiB while fuzzing"
    want = int(os.environ.get("UMBP_HOSTILE_FUZZ_MIN_INPUTS", "0"))
    assert INPUTS[0] >= want, f"{INPUTS[0]} inputs answered, the figure is {want}"


# ---- hostile values, written as TOML -------------------------------------------------------


class Raw(str):
    """TOML text written as is (an integer of 5,000 digits: str(int) stops at 4,300)."""


def toml_value(v: Any) -> str:
    if isinstance(v, Raw):
        return str(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return (
            "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
        )
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise AssertionError(type(v))


KEY_NAMES = sorted(SCENARIO_MACHINE_KEYS) + [
    "size", "backing", "hugepage_size", "numa_node", "prefault", "kind", "steps", "layers",
    "kv_heads", "head_dim", "kv_lora_rank", "hicache_size", "hicache_ratio", "page_size",
    "layout", "tp_size", "dtype", "outcome", "actual_backing", "mapped_size", "error",
    "error_regex", "warnings", "no_warnings", "signal", "crash_node", "counters", "no_leaks",
    "op", "errno", "nth", "calls", "every", "first", "probability", "seed", "max_fires",
    "min_length", "max_length", "node", "mode", "path", "throw", "content", "flags_has",
    "2MiB", "1GiB", "hugepages.2MiB.free", "x",
]  # fmt: skip
atoms = st.one_of(
    st.integers(-4, 4),
    st.integers(-(1 << 70), 1 << 70),
    st.sampled_from([2**31 - 1, 2**31, 2**62, 2**63, 2**64, 10**30, 1024, 1025, 10**9]),
    st.just(Raw("1" + "0" * 5000)),
    st.floats(),
    st.booleans(),
    st.text(max_size=12),
    st.sampled_from(
        [
            "2MiB",
            "1GiB",
            "4096",
            "-1",
            "1e9",
            "1.5GiB",
            "100000PiB",
            "x" * 5000,
            "9" * 5000,
            "(a+)+$",
            ".*.*.*.*Z",
            "Anonymous",
            "AnonymousHugetlb",
            "AnonymousShm",
            "mmap",
            "madvise",
            "ENOMEM",
            "EFAULT",
            "bad_alloc",
            "SIGBUS",
            "ok",
            "failed",
            "x86_64",
            "arm64",
            "5.15.0",
            "alloc",
            "free",
            "steps",
            "sglang",
            "MAP_HUGETLB",
            "MAP_HUGE_2MB",
            "page_first",
        ]
    ),  # fmt: skip
)
values = st.recursive(
    atoms,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(KEY_NAMES) | st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=8,
)
deep = st.integers(1, 3000).map(lambda d: Raw("[" * d + "]" * d))
hostile = st.one_of(values, values, values, deep)


# ---- scenario files --------------------------------------------------------------------------

BASE: dict[str, Any] = {
    "scenario": {"name": "f", "description": "fuzz"},
    "machine": {"nodes": 2, "hugepages": {"2MiB": 8}},
    "request": {"size": "4MiB", "backing": "AnonymousHugetlb"},
    "expect": {"outcome": "ok"},
}
STEPS = [{"op": "alloc", "id": "a", "size": 4096}, {"op": "free", "id": "a"}]
SGLANG = {"kind": "sglang", "layers": 2, "kv_heads": 2, "head_dim": 64, "hicache_size": 1}
RULE = {"op": "mmap", "errno": "ENOMEM", "nth": 1}
# Where a value goes: (table, key) pairs; "faults" is the first rule, "steps" the first step.
SLOTS = (
    [("machine", k) for k in sorted(SCENARIO_MACHINE_KEYS)]
    + [
        ("request", k)
        for k in ("size", "backing", "hugepage_size", "numa_node", "prefault", "kind", "steps")
    ]  # fmt: skip
    + [("sglang", k) for k in SGLANG]
    + [("steps", k) for k in ("op", "id", "size", "offset", "pages", "node", "hugepage_size")]
    + [
        ("expect", k)
        for k in (
            "outcome",
            "actual_backing",
            "mapped_size",
            "error",
            "error_regex",
            "warnings",
            "no_warnings",
            "signal",
            "crash_node",
            "counters",
            "no_leaks",
            "steps",
        )
    ]  # fmt: skip
    + [
        ("faults", k)
        for k in (
            "op",
            "errno",
            "nth",
            "calls",
            "every",
            "first",
            "probability",
            "seed",
            "max_fires",
            "min_length",
            "max_length",
            "throw",
            "content",
            "flags_has",
            "node",
            "path",
            "name",
        )
    ]  # fmt: skip
    + [("scenario", k) for k in ("name", "description", "tags", "allocator", "sglang")]
    + [("top", k) for k in ("fault_seed", "umbp_sim_scenario", "faults", "env", "machine")]
    + [("env", k) for k in ("SGLANG_HICACHE_HOST_NUMA_NODE", "MORI_UMBP_LOG_LEVEL")]
)


def scenario_text(slot: tuple[str, str], value: Any) -> str:
    doc = json.loads(json.dumps(BASE))
    top: dict[str, Any] = {}
    where, key = slot
    if where == "sglang":
        doc["request"] = dict(SGLANG, **{key: value})
    elif where == "steps":
        doc["request"] = {"kind": "steps", "steps": [dict(STEPS[0], **{key: value}), STEPS[1]]}
    elif where == "faults":
        top["faults"] = [dict(RULE, **{key: value})]
    elif where == "top":
        top[key] = value
        if key in ("machine",):
            doc.pop("machine")
    elif where == "env":
        doc["env"] = {key: value}
    else:
        doc[where][key] = value
    lines = [f"{k} = {toml_value(v)}" for k, v in top.items()]
    for name, table in doc.items():
        lines.append(f"[{name}]")
        lines += [f"{json.dumps(k)} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def answered(argv: list[str], ok: set[int]) -> int:
    """Run the CLI in this process: the exit status must be in ``ok`` (never 70), and an
    error must be one line."""
    INPUTS[0] += 1
    out, err = io.StringIO(), io.StringIO()
    start = time.process_time()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = cli.main(argv)
            except SystemExit as e:
                rc = int(e.code or 0) if not isinstance(e.code, str) else 1
    finally:
        elapsed = time.process_time() - start
        SLOWEST[0] = max(SLOWEST[0], elapsed)
    EXITS[rc] = EXITS.get(rc, 0) + 1
    text = err.getvalue()
    assert elapsed < PER_INPUT_SECONDS, f"{elapsed:.1f} s of CPU for {argv!r:.300}"
    assert rc in ok, f"exit {rc} for {argv!r:.300}: {text[:500]}"
    assert "Traceback" not in text, text[:2000]
    if rc in (64, 65, 66):
        assert text.count("\n") == 1 and len(text) < 2000, text[:2000]
    return rc


RUN_EXITS = {0, 1, 65}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hostile-fuzz")


@FUZZ
@given(hostile, st.lists(st.sampled_from(SLOTS), min_size=1, max_size=KEYS_PER_VALUE))
def test_scenario_values(scratch: Path, value: Any, slots: list[tuple[str, str]]) -> None:
    """A hostile value under several keys of an otherwise valid scenario: each file is one
    input (``umbp-sim run FILE``)."""
    path = scratch / "s.toml"
    for slot in slots:
        path.write_text(scenario_text(slot, value))
        answered(["run", str(path)], RUN_EXITS)


@FUZZ
@given(st.sampled_from(SLOTS), st.integers(0, 10**6), st.text(max_size=30), st.integers(0, 3))
def test_scenario_text_cut_and_spliced(
    scratch: Path, slot: tuple[str, str], at: int, splice: str, how: int
) -> None:
    """The text itself broken: cut, spliced, a line dropped (not always TOML)."""
    text = scenario_text(slot, BASE["machine"]["nodes"])
    at %= len(text) + 1
    if how == 0:
        text = text[:at]
    elif how == 1:
        text = text[:at] + splice + text[at:]
    elif how == 2:
        lines = text.splitlines()
        del lines[at % len(lines)]
        text = "\n".join(lines)
    path = scratch / "t.toml"
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    answered(["run", str(path)], RUN_EXITS)


# ---- the command line ---------------------------------------------------------------------------

FLAG_VALUES = st.one_of(
    st.sampled_from(
        [
            "0",
            "1",
            "-1",
            "2",
            "64",
            "2147483647",
            "2147483648",
            "18446744073709551616",
            "9" * 5000,
            "1GiB",
            "2MiB",
            "1.5",
            "inf",
            "nan",
            "-inf",
            "1e308",
            "",
            " ",
            "hugetlb",
            "anonymous",
            "shm",
            "bfloat16",
            "layer_first",
            "x" * 5000,
        ]
    ),  # fmt: skip
    st.integers(-(1 << 70), 1 << 70).map(str),
    st.text(max_size=10),
)
FLAGS = ["--size", "--backing", "--hugepage-size", "--numa-node", "--model-layers", "--kv-heads",
         "--head-dim", "--kv-lora-rank", "--qk-rope-head-dim", "--index-head-dim", "--dtype",
         "--hicache-size", "--hicache-ratio", "--device-pool-tokens", "--page-size", "--layout",
         "--tp-size", "--ranks", "--env", "--error", "--sglang"]  # fmt: skip
ERROR_LINE = (
    "RuntimeError: UMBPHostMemAllocator.alloc({}) failed (requested_backing={}, numa_node={})."
)


@pytest.fixture(scope="module")
def meminfo(scratch: Path) -> Path:
    p = scratch / "meminfo"
    p.write_text("MemTotal: 16777216 kB\nMemFree: 8388608 kB\n")
    return p


@FUZZ
@given(
    st.sampled_from(["replay", "preflight"]),
    st.lists(st.tuples(st.sampled_from(FLAGS), FLAG_VALUES), max_size=5),
    st.sampled_from(
        [
            [],
            ["--size", "1GiB"],
            ["--model-layers", "2", "--kv-heads", "2", "--head-dim", "64", "--hicache-size", "1"],
        ]
    ),  # fmt: skip
    st.sampled_from([[], ["--no-prefault"], ["--json"], ["--allocator", "umbp-sim"]]),
    st.one_of(st.none(), st.tuples(FLAG_VALUES, FLAG_VALUES, FLAG_VALUES)),
)
def test_request_flags(
    meminfo: Path,
    command: str,
    flags: list[tuple[str, str]],
    base: list[str],
    extra: list[str],
    error: tuple[str, str, str] | None,
) -> None:
    where = [str(meminfo)] if command == "replay" else ["--root", str(meminfo)]
    argv = [command, *where, *base, *extra]
    for flag, value in flags:
        argv += [flag, value]
    if error is not None:
        argv += ["--error", ERROR_LINE.format(*error)]
    # replay: 0 answered; preflight: 0/1/2 its answer; 64 usage, 65 data
    answered(argv, {0, 1, 2, 64, 65})


# ---- the Python API -------------------------------------------------------------------------------

BUILD_KEYS = ["nodes", "mem_per_node", "hugepages", "hugepages_per_node", "page_size",
              "hugepage_sizes", "default_hugepage_size", "arch", "kernel_version", "root",
              "overcommit_memory", "overcommit_ratio", "possible_nodes", "watermark_low",
              "hugepages_reserved", "hugetlb_cgroup_max", "mem_total", "swap_total", "name"]  # fmt: skip
RULE_KEYS = ["op", "errno", "signal", "nth", "calls", "every", "first", "probability", "seed",
             "max_fires", "min_length", "max_length", "node", "mode", "advice", "path", "throw",
             "content", "flags_has", "memfd_flags_has", "name"]  # fmt: skip
py_values = st.one_of(
    values.filter(lambda v: not isinstance(v, Raw)),
    st.just(10**5000),
    st.sampled_from([None, object(), b"2MiB", (1, 2), {1, 2}, 1j]),
)


def api_input(call: Any, errors: tuple[type[BaseException], ...]) -> None:
    INPUTS[0] += 1
    start = time.process_time()
    try:
        call()
    except errors as e:
        text = str(e)
        assert "\n" not in text and len(text) < 2000, text[:2000]
    finally:
        elapsed = time.process_time() - start
        SLOWEST[0] = max(SLOWEST[0], elapsed)
        assert elapsed < PER_INPUT_SECONDS


@FUZZ
@given(py_values, st.lists(st.sampled_from(BUILD_KEYS), min_size=1, max_size=KEYS_PER_VALUE),
       st.lists(st.sampled_from(RULE_KEYS), min_size=1, max_size=KEYS_PER_VALUE))  # fmt: skip
def test_python_api(value: Any, build_keys: list[str], rule_keys: list[str]) -> None:
    """Machine.build, Machine.validate and the fault-rule readers: MachineError or
    FaultPlanError, one line, for any value."""
    for key in build_keys:
        api_input(lambda key=key: Machine.build(**{key: value}), (MachineError,))

        def direct(key: str = key) -> None:
            m = Machine()
            if key in {f for f in Machine.__dataclass_fields__}:
                setattr(m, key, value)
            m.validate()

        api_input(direct, (MachineError,))
    for key in rule_keys:
        api_input(
            lambda key=key: FaultPlan.from_rules([dict(RULE, **{key: value})]), (FaultPlanError,)
        )
        api_input(lambda key=key: FaultRule(**dict(RULE, **{key: value})), (FaultPlanError,))


# ---- compare --merge: shard files --------------------------------------------------------------

MERGE_EXITS = {0, 1, 64, 65}
# Where a value goes in shard 1 of 2: a path of keys and places; the last one is set.
SHARD_SLOTS: list[tuple[Any, ...]] = [
    (k,) for k in ("a", "b", "runs", "differing_runs", "same", "differences", "shard", "x")
] + [("shard", k) for k in ("k", "n", "total", "digest", "x")] + [
    ("differences", "warning text"), ("differences", "outcome"), ("differences", "x"),
    ("differences", "warning text", 0),
] + [("differences", "warning text", 0, k) for k in ("run", "index", "a", "b", "texts_a", "x")]  # fmt: skip


def json_value(v: Any) -> str:
    """JSON text of a drawn value (Raw as is: a 5,000-digit integer, arrays nested deep)."""
    if isinstance(v, Raw):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(json_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {json_value(x)}" for k, x in v.items()) + "}"
    return json.dumps(v)  # NaN and Infinity as Python writes them


@pytest.fixture(scope="module")
def shards(scratch: Path) -> dict[str, Any]:
    """A valid pair of shards (2 of the runs of size 4096): shard 1's document, 2's path."""
    argv = ["compare", "umbp-sim", "mori-624002c", "--no-scenarios", "-k", "*size=4096,*"]
    docs = []
    for k in (1, 2):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert cli.main([*argv, "--shard", f"{k}/2", "--json"]) == 1
        docs.append(json.loads(out.getvalue()))
    (scratch / "shard-2.json").write_text(json.dumps(docs[1]))
    return {"doc": docs[0], "other": str(scratch / "shard-2.json")}


@FUZZ
@given(hostile, st.lists(st.sampled_from(SHARD_SLOTS), min_size=1, max_size=KEYS_PER_VALUE))
def test_merged_shard_values(
    scratch: Path, shards: dict[str, Any], value: Any, slots: list[tuple[Any, ...]]
) -> None:
    """A hostile value in several places of a shard (``compare --merge``): one line naming the
    file and the field, or the comparison the shards make."""
    path = scratch / "shard-1.json"
    for slot in slots:
        doc = json.loads(json.dumps(shards["doc"]))
        where = doc
        for key in slot[:-1]:
            where = where[key]
        where[slot[-1]] = "@@hostile@@"
        path.write_text(json.dumps(doc).replace('"@@hostile@@"', json_value(value)))
        answered(["compare", "--merge", str(path), shards["other"]], MERGE_EXITS)


# ---- the external protocols' frames (issue 43 points 2, 4, 9) ------------------------------------

# Tags and class names a forged frame may use (umbp_sim/external/wire.py), among others.
WIRE_TAGS = ["t", "d", "s", "z", "b", "f", "o", "v", "x", "e", "stage", ""]
WIRE_NAMES = [
    ["umbp_sim.engine.record", "RunRecord"], ["umbp_sim.vocabulary.units", "Size"],
    ["umbp_sim.dump.notes", "Note"], ["umbp_sim.faults", "FaultRule"],
    ["umbp_sim.external.evidence", "Death"], ["umbp_sim.errors", "UmbpSimError"],
    ["builtins", "bytearray"], ["fractions", "Fraction"], ["os", "system"],
    ["umbp_sim.__main__", "main"], ["umbp_sim.external.procs", "kill_group"],
    ["umbp_sim.no_such_module", "X"],
]  # fmt: skip
json_leaves = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False,
    allow_infinity=False), st.text(max_size=20), st.sampled_from(["__class__", "__dict__", "op"]),
)  # fmt: skip


def _tagged(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=5),
        st.builds(lambda tag, body: {tag: body}, st.sampled_from(WIRE_TAGS), children),
        st.builds(lambda tag, name, rest: {tag: name + rest}, st.sampled_from(["o", "v", "x", "e"]),
                  st.sampled_from(WIRE_NAMES), st.lists(children, max_size=3)),
        st.dictionaries(st.text(max_size=8), children, max_size=4),
    )  # fmt: skip


wire_docs = st.recursive(json_leaves, _tagged, max_leaves=30)
RAW_FRAMES = [
    b"[" * 50_000, b'{"t":[' * 300 + b"]}" * 300, b"9" * 100_000, b"[1e400]", b"[NaN]",
    b"[" + b"0," * 3_000_000 + b"0]", b"\x80\x04cbuiltins\nbytearray\nJ\x00\x00\x00\x80\x85R.",
    b'{"d":[[1],2]}', b'{"b":"zz"}', b'{"f":"1e999"}', b"",
]  # fmt: skip


def _wire_input(payload: bytes) -> None:
    """One frame through every reader of the protocols: the message decoder and the checks of a
    server's hello and reply, and the evidence reader. Each answers in bounded time with a
    value or one line, never another exception."""
    from umbp_sim.external.evidence import EvidenceReader
    from umbp_sim.external.procs import FrameError, frame, loads
    from umbp_sim.external.runner import _hello_problem, _reply_problem

    def call() -> None:
        try:
            msg = loads(payload)
        except FrameError as e:
            assert "\n" not in str(e) and len(str(e)) < 300, str(e)
        else:
            for problem in (_hello_problem(msg), _reply_problem(msg)):
                assert problem is None or "\n" not in problem
        reader = EvidenceReader(program=7, token="ab")
        reader.feed(frame(payload))
        assert reader.problem is None or "\n" not in reader.problem

    api_input(call, ())


@FUZZ
@given(wire_docs, st.integers(0, 3), st.binary(max_size=8), st.integers(0, 2**16))
def test_protocol_frames(doc: Any, how: int, junk: bytes, at: int) -> None:
    """Forged and damaged frames on the external protocols' fds (an allocator's or a program's
    code can write there): a value or one line, in bounded time and memory."""
    from umbp_sim.external.wire import encode

    text = json.dumps(doc).encode()
    if how == 1:  # a message of umbp-sim's, damaged at one place
        text = encode(
            {"result": None, "stages": ["alloc"], "x": doc if isinstance(doc, str) else 1}
        )
    if how >= 1 and text:
        i = at % len(text)
        text = text[:i] + junk + text[i + len(junk) * (how - 1) :]
    _wire_input(text)
    if how == 3:
        _wire_input(RAW_FRAMES[at % len(RAW_FRAMES)])


# ---- build-allocator's inputs ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def build_paths(scratch: Path) -> list[str]:
    """Paths build-allocator may be given as a source, a header directory, a checkout or OUT:
    a FIFO, a directory, devices, a sparse 6 GiB file, a fake checkout whose headers are a FIFO
    and a 6 GiB file, a path that does not exist."""
    d = scratch / "build"
    d.mkdir()
    os.mkfifo(d / "fifo")
    with open(d / "huge.h", "wb") as f:
        f.truncate(6 << 30)
    checkout = d / "mori"
    for rel in ("src/umbp/local", "src/umbp/include/umbp/local", "include/mori/utils"):
        (checkout / rel).mkdir(parents=True)
    (checkout / "src/umbp/local/host_mem_allocator.cpp").write_text("int x;\n")
    os.mkfifo(checkout / "src/umbp/include/umbp/local/host_mem_allocator.h")
    os.link(d / "huge.h", checkout / "include/mori/utils/mori_log.hpp")
    return [str(d / "fifo"), str(d), "/dev/zero", "/dev/stdin", "/dev/full", str(d / "huge.h"),
            str(checkout), str(d / "missing.cpp"), "-"]  # fmt: skip


BUILD_FLAGS = ["--build-timeout", "--build-memory", "-o", "-I", "-D", "--link-arg", "--mori"]


# Each input parses the whole command line (argparse: about 20 ms): at most 500 examples, under
# a minute in tox -e hostilefuzz.
@settings(FUZZ, max_examples=min(FUZZ.max_examples, 500))
@given(
    st.lists(st.one_of(st.integers(0, 8), FLAG_VALUES), max_size=3),
    st.lists(
        st.tuples(st.sampled_from(BUILD_FLAGS), st.one_of(st.integers(0, 8), FLAG_VALUES)),
        max_size=5,
    ),  # fmt: skip
    st.sampled_from([[], ["--print-command"], ["--mori-binding"]]),
)
def test_build_allocator_inputs(
    build_paths: list[str], sources: list[Any], flags: list[tuple[str, Any]], extra: list[str]
) -> None:
    """Sources, headers, checkouts and outputs that are FIFOs, devices, directories or 6 GiB;
    hostile limits: one line each, never a read of them or a wait. The compiler named does not
    exist, so nothing is ever compiled."""

    def value(v: Any) -> str:  # no NUL: a command line's arguments are C strings
        return build_paths[v] if isinstance(v, int) else v.replace("\x00", "")

    argv = ["build-allocator", *[value(s) for s in sources]]
    for flag, v in flags:
        argv += [flag, value(v)]
    argv += [*extra, "--cxx", "/nonexistent/c++"]
    answered(argv, {0, 64, 65, 73})
