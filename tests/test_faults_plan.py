"""FaultPlan: the [[faults]] TOML/dict schema, its errors, and the round trip."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from umbp_sim.errors import UmbpSimError
from umbp_sim.faults import OPS, FaultPlan, FaultPlanError, FaultRule

GiB = 1 << 30

EXAMPLE = """
fault_seed = 7

[[faults]]
name = "no 2 MiB pages"
op = "mmap"
errno = "ENOMEM"
flags_has = ["MAP_HUGETLB", "MAP_HUGE_2MB"]
flags_lacks = "MAP_NORESERVE"
min_length = "1GiB"
probability = 0.25
max_fires = 3

[[faults]]
op = "mbind"
errno = "EINVAL"
node = 3
mode = "MPOL_BIND"

[[faults]]
op = "touch"
signal = "SIGBUS"
nth = 2

[[faults]]
op = "read_file"
errno = "ENOENT"
path = "/sys/kernel/mm/hugepages/*"
calls = [2, 4]
"""


def test_from_toml_reads_every_key():
    plan = FaultPlan.from_toml(EXAMPLE)
    assert plan.seed == 7
    assert len(plan.rules) == 4
    r = plan.rules[0]
    assert r == FaultRule(
        op="mmap",
        errno="ENOMEM",
        flags_has=("MAP_HUGETLB", "MAP_HUGE_2MB"),
        flags_lacks=("MAP_NORESERVE",),
        min_length=GiB,
        probability=0.25,
        max_fires=3,
        name="no 2 MiB pages",
    )
    assert plan.rules[1] == FaultRule(op="mbind", errno="EINVAL", node=3, mode="MPOL_BIND")
    assert plan.rules[2] == FaultRule(op="touch", signal="SIGBUS", nth=2)
    assert plan.rules[3].calls == (2, 4)
    assert plan.rules[3].path == "/sys/kernel/mm/hugepages/*"


def test_to_toml_writes_only_set_keys_and_reads_back():
    plan = FaultPlan.from_toml(EXAMPLE)
    text = plan.to_toml()
    assert "fault_seed = 7" in text
    assert 'min_length = "1GiB"' in text
    assert 'flags_has = "MAP_HUGETLB|MAP_HUGE_2MB"' in text
    assert text.split("[[faults]]")[1].startswith('\nname = "no 2 MiB pages"\nop = "mmap"\n')
    assert "nth" not in text.split("[[faults]]")[1]  # unset keys are not written
    assert FaultPlan.from_toml(text) == plan


def test_from_toml_reads_a_file(tmp_path):
    p = tmp_path / "plan.toml"
    p.write_text(EXAMPLE)
    assert FaultPlan.from_toml(p) == FaultPlan.from_toml(str(p)) == FaultPlan.from_toml(EXAMPLE)


def test_missing_file_is_one_line(tmp_path):
    with pytest.raises(FaultPlanError, match=r"nope\.toml: cannot read: No such file"):
        FaultPlan.from_toml(tmp_path / "nope.toml")


@pytest.mark.parametrize(
    "table, message",
    [
        ({"op": "mmap", "errno": "ENOMEM", "colour": 1}, "faults[0].colour: unknown key"),
        ({"errno": "ENOMEM"}, "faults[0].op: missing"),
        ({"op": "mremap", "errno": "ENOMEM"}, "faults[0].op: unknown operation 'mremap'"),
        ({"op": "mmap", "errno": "ENOMEMX"}, "faults[0].errno: unknown errno 'ENOMEMX'"),
        ({"op": "mmap"}, "faults[0].errno: give exactly one of errno, signal, content, throw"),
        (
            {"op": "read_file", "signal": "SIGBUS"},
            "faults[0].signal: read_file cannot be answered with a signal",
        ),
        (
            {"op": "mmap", "content": "x"},
            "faults[0].content: only read_file takes content, not mmap",
        ),
        (
            {"op": "read_file", "errno": "EIO", "content": "x"},
            "faults[0].content: give exactly one of errno, signal, content, throw",
        ),
        ({"op": "touch", "signal": "SIGFOO"}, "faults[0].signal: unknown signal 'SIGFOO'"),
        ({"op": "mmap", "errno": "ENOMEM", "nth": 0}, "faults[0].nth: must be >= 1, got 0"),
        ({"op": "mmap", "errno": "ENOMEM", "nth": "3"}, "faults[0].nth: expected an integer"),
        (
            {"op": "mmap", "errno": "ENOMEM", "nth": 1, "every": 2},
            "faults[0].every: use only one of nth, calls, every, first",
        ),
        (
            {"op": "mmap", "errno": "ENOMEM", "calls": [5, 2]},
            r"faults\[0\].calls: expected \[a, b\] with 1 <= a <= b, got \[5, 2\]",
        ),
        (
            {"op": "mmap", "errno": "ENOMEM", "probability": 1.5},
            r"faults\[0\].probability: expected a number in \[0, 1\], got 1.5",
        ),
        (
            {"op": "mmap", "errno": "ENOMEM", "flags_has": ["MAP_HUGE"]},
            "faults[0].flags_has: unknown mmap flag 'MAP_HUGE'",
        ),
        (
            {"op": "mmap", "errno": "ENOMEM", "flags_has": ["MAP_HUGE_3MB"]},
            "faults[0].flags_has: unknown mmap flag 'MAP_HUGE_3MB'",
        ),
        (
            {"op": "mmap", "errno": "ENOMEM", "min_length": "2 parsecs"},
            "faults[0].min_length: cannot read size '2 parsecs'",
        ),
        (
            {"op": "mmap", "errno": "ENOMEM", "min_length": "2MiB", "max_length": "1MiB"},
            "faults[0].min_length: is larger than max_length",
        ),
        (
            {"op": "mmap", "errno": "ENOMEM", "advice": "MADV_POPULATE_WRITE"},
            "faults[0].advice: does not apply to op 'mmap' (only madvise)",
        ),
        (
            {"op": "madvise", "errno": "EINVAL", "advice": "MADV_POPULATE"},
            "faults[0].advice: unknown madvise advice 'MADV_POPULATE'",
        ),
        ({"op": "mbind", "errno": "EINVAL", "mode": "BIND"}, "faults[0].mode: unknown mbind mode"),
        ({"op": "mbind", "errno": "EINVAL", "node": -1}, "faults[0].node: must be >= 0, got -1"),
        (
            {"op": "memfd_create", "errno": "EINVAL", "memfd_flags_has": ["MAP_HUGETLB"]},
            "faults[0].memfd_flags_has: unknown memfd flag 'MAP_HUGETLB'",
        ),
        (
            {"op": "read_file", "errno": "ENOENT", "path": 3},
            "faults[0].path: expected a string, got 3",
        ),
        (
            {"op": "mmap", "throw": "std::bad_alloc"},
            "faults[0].throw: only 'bad_alloc' can be thrown, got 'std::bad_alloc'",
        ),
        ({"op": "mmap", "errno": "ENOMEM", "max_fires": 0}, "faults[0].max_fires: must be >= 1"),
    ],
)
def test_bad_rules_are_one_line_errors_naming_the_key(table, message):
    good = {"op": "close", "errno": "EBADF"}
    with pytest.raises(FaultPlanError) as info:
        FaultPlan.from_dict({"faults": [table, good]})
    text = str(info.value)
    assert "\n" not in text
    import re

    assert re.search(message if "\\" in message else re.escape(message), text), text
    assert isinstance(info.value, UmbpSimError)


def test_error_names_the_rule_index():
    with pytest.raises(FaultPlanError, match=r"^faults\[1\]\.errno: unknown errno 'EWHAT'$"):
        FaultPlan.from_dict(
            {"faults": [{"op": "close", "errno": "EBADF"}, {"op": "close", "errno": "EWHAT"}]}
        )


def test_unknown_top_level_key_and_bad_toml():
    with pytest.raises(FaultPlanError, match=r"^seed: unknown key"):
        FaultPlan.from_dict({"seed": 3, "faults": []})
    with pytest.raises(FaultPlanError, match=r"^invalid TOML: "):
        FaultPlan.from_toml("[[faults]\nop=")
    with pytest.raises(FaultPlanError, match=r"^plan.fault_seed: must be >= 0"):
        FaultPlan.from_toml("fault_seed = -1\n")


def test_toml_that_tomllib_cannot_hold_is_a_plan_error_not_a_traceback():
    # what a scenario file gets (umbp_sim.vocabulary.toml_text), a plan gets too
    with pytest.raises(FaultPlanError, match=r"^invalid TOML: arrays or tables nested too deep"):
        FaultPlan.from_toml("fault_seed = " + "[" * 100_000 + "]" * 100_000)
    with pytest.raises(FaultPlanError, match=r"^invalid TOML: a number too long to read \("):
        FaultPlan.from_toml("fault_seed = " + "9" * 5000)


def test_file_errors_name_the_file(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text('[[faults]]\nop = "mmap"\nerrno = "ENOMEM"\nevery = 0\n')
    with pytest.raises(
        FaultPlanError, match=r"bad\.toml: faults\[0\]\.every: must be >= 1, got 0$"
    ):
        FaultPlan.from_toml(p)


def test_direct_construction_validates():
    with pytest.raises(FaultPlanError, match=r"^fault rule\.errno: unknown errno 'nope'$"):
        FaultRule(op="mmap", errno="nope")


# ---- round trip -------------------------------------------------------------------------

_errnos = st.sampled_from(
    ["ENOMEM", "EINVAL", "EFAULT", "ENOSYS", "ENODEV", "EPERM", "EBADF", "EIO"]
)
_map_flags = st.lists(
    st.sampled_from(
        ["MAP_HUGETLB", "MAP_NORESERVE", "MAP_POPULATE", "MAP_ANONYMOUS", "MAP_LOCKED"]
    ),
    unique=True,
    max_size=3,
)


@st.composite
def rules(draw):
    op = draw(st.sampled_from(OPS))
    kw = {"op": op}
    if op == "read_file" and draw(st.booleans()):
        kw["content"] = draw(st.text(max_size=30))
    elif draw(st.integers(0, 4)) == 0:
        kw["throw"] = "bad_alloc"
    elif op != "read_file" and draw(st.booleans()):
        kw["signal"] = draw(st.sampled_from(["SIGBUS", "SIGKILL"]))
    else:
        kw["errno"] = draw(_errnos)
    which = draw(st.sampled_from([None, "nth", "calls", "every", "first"]))
    if which == "calls":
        a = draw(st.integers(1, 100))
        kw["calls"] = (a, a + draw(st.integers(0, 100)))
    elif which is not None:
        kw[which] = draw(st.integers(1, 1000))
    if draw(st.booleans()):
        kw["probability"] = draw(st.floats(0.0, 1.0, allow_nan=False))
    if draw(st.booleans()):
        kw["seed"] = draw(st.integers(0, 2**64 - 1))
    if draw(st.booleans()):
        kw["max_fires"] = draw(st.integers(1, 50))
    if op in ("mmap", "munmap", "madvise", "mbind", "ftruncate", "touch"):
        if draw(st.booleans()):
            lo = draw(st.integers(0, 1 << 42))
            kw["min_length"] = lo
            if draw(st.booleans()):
                kw["max_length"] = lo + draw(st.integers(0, 1 << 42))
    if op == "mmap":
        kw["flags_has"] = tuple(draw(_map_flags)) + tuple(
            draw(
                st.lists(
                    st.sampled_from(["MAP_HUGE_2MB", "MAP_HUGE_1GB", "MAP_PRIVATE"]), max_size=1
                )
            )
        )
        kw["flags_lacks"] = tuple(draw(_map_flags))
    if op == "madvise" and draw(st.booleans()):
        kw["advice"] = draw(st.sampled_from(["MADV_POPULATE_WRITE", "MADV_DONTNEED"]))
    if op == "mbind":
        if draw(st.booleans()):
            kw["node"] = draw(st.integers(0, 1023))
        if draw(st.booleans()):
            kw["mode"] = draw(st.sampled_from(["MPOL_BIND", "MPOL_PREFERRED", "MPOL_INTERLEAVE"]))
    if op == "memfd_create" and draw(st.booleans()):
        kw["memfd_flags_has"] = ("MFD_HUGETLB", "MFD_HUGE_2MB")
    if op == "read_file" and draw(st.booleans()):
        kw["path"] = draw(st.sampled_from(["/proc/meminfo", "/sys/devices/system/node/*"]))
    if draw(st.booleans()):
        kw["name"] = draw(st.text(max_size=20))
    return FaultRule(**kw)


@settings(max_examples=200, deadline=None)
@given(st.lists(rules(), max_size=5), st.integers(0, 2**64 - 1))
def test_toml_round_trip(rule_list, seed):
    plan = FaultPlan(tuple(rule_list), seed)
    assert FaultPlan.from_toml(plan.to_toml()) == plan
    assert FaultPlan.from_dict(plan.to_dict()) == plan
    plan.wrap(__import__("umbp_sim._native", fromlist=["x"]).LinuxKernel())  # native accepts it
