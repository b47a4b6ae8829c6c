"""The three meminfo readers share one tokenizer (umbp_sim/vocabulary/meminfo.py) and agree.

``dump.parse.parse_meminfo`` (the keys umbp-sim uses, kB in bytes, DumpError),
``sglang.sizing.parse_meminfo`` (every key, in the file's unit, SizingError) and
``SimHost.meminfo`` (a rendered file, in the file's unit) are views of it: on every fixture
machine's proc/meminfo and on what SimKernel renders for it they read the same numbers, and each
keeps its own error text.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from umbp_sim.dump import DumpError, load_dump, parse_meminfo as dump_view, parse_node_meminfo
from umbp_sim.dump.parse import MEMINFO_KB_KEYS
from umbp_sim.sglang.sizing import SizingError, parse_meminfo as sizing_view
from umbp_sim.sim import SimHost
from umbp_sim.vocabulary import meminfo

DATA = Path(__file__).parent / "data" / "machines"
TARBALLS = sorted(DATA.glob("*.tar.bz2"))


def _meminfo_text(tarball: Path) -> str:
    with tarfile.open(tarball) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/proc/meminfo"))
        f = tar.extractfile(member)
        assert f is not None
        return f.read().decode("ascii")


def _agree(text: str) -> dict[str, int]:
    """The three views of one file, checked against each other; returns the sizing view."""
    in_bytes = dump_view(text)
    in_units = sizing_view(text)
    assert meminfo.file_units(text) == in_units
    assert in_bytes  # MemTotal at least
    for key, value in in_bytes.items():
        assert value == in_units[key] * (1024 if key in MEMINFO_KB_KEYS else 1), key
    return in_units


def test_fixture_set_is_all_there() -> None:
    assert len(TARBALLS) == 8


@pytest.mark.parametrize("tarball", TARBALLS, ids=lambda p: p.name.split(".")[0])
def test_views_agree_on_fixture_machines(tarball: Path) -> None:
    text = _meminfo_text(tarball)
    units = _agree(text)
    assert units["MemTotal"] > 0
    # The machine the dump describes, simulated: SimHost.meminfo reads what it renders, and the
    # other two views read the same numbers from that text.
    machine, _ = load_dump(tarball)
    host = SimHost(machine)
    rendered = host.read("/proc/meminfo")
    assert host.meminfo() == _agree(rendered)
    assert host.meminfo()["MemTotal"] == units["MemTotal"]


def test_tokenizer_cuts_at_the_first_colon() -> None:
    lines = list(meminfo.meminfo_lines(["", "A: 1 kB", "  ", "B(x):2", "no colon", "C: a:b"]))
    assert [(t.lineno, t.key, t.has_colon, t.value) for t in lines] == [
        (2, "A", True, " 1 kB"),
        (4, "B(x)", True, "2"),
        (5, "no colon", False, ""),
        (6, "C", True, " a:b"),
    ]
    assert meminfo.split_lines("a\nb\n") == ["a", "b"]
    assert meminfo.split_lines("a\nb") == ["a", "b"]


# Each view keeps its error text.
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("MemTotal: 1 kB\nFoo bar: 2 kB\n", "m:2: expected 'Key: value', got 'Foo bar: 2 kB'"),
        ("MemTotal: 1 kB\nno colon\n", "m:2: expected 'Key: value', got 'no colon'"),
        ("MemTotal: x kB\n", "m:1: cannot read value 'x kB' for MemTotal"),
        ("MemTotal: 1 kB\nMemTotal: 1 kB\n", "m:2: MemTotal appears twice"),
        ("MemFree: 1 kB\n", "m: no MemTotal line (not a meminfo file?)"),
    ],
)
def test_dump_view_errors(text: str, message: str) -> None:
    with pytest.raises(DumpError) as e:
        dump_view(text, "m")
    assert str(e.value) == message


@pytest.mark.parametrize(
    "line", ["garbage", ": 5 kB", "MemTotal:", "MemTotal: 5 kB extra", "MemTotal: -5 kB"]
)
def test_sizing_view_errors(line: str) -> None:
    with pytest.raises(SizingError) as e:
        sizing_view(f"MemTotal: 5 kB\n\n{line}\n", "m")
    assert str(e.value) == f"m:3: cannot read meminfo line {line!r}"


def test_node_view_errors() -> None:
    with pytest.raises(DumpError) as e:
        parse_node_meminfo("Node 1 MemTotal: 4 kB\n", 0, "n")
    assert str(e.value) == "n:1: line is about node 1, file is node0's"
    with pytest.raises(DumpError) as e:
        parse_node_meminfo("Node 0 MemTotal: 4 kB\nMemFree: 1 kB\n", 0, "n")
    assert str(e.value) == "n:2: expected 'Node 0 Key: value', got 'MemFree: 1 kB'"
    assert parse_node_meminfo("Node 0 MemTotal: 4 kB\nNode 0 HugePages_Free: 3\n", 0) == {
        "MemTotal": 4096,
        "HugePages_Free": 3,
    }
