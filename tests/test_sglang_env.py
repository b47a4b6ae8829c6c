"""SGLANG_HICACHE_HOST_* parsing: sglang's exact semantics, umbp-sim's clear errors."""

from __future__ import annotations

import pytest

from umbp_sim.errors import UmbpSimError
from umbp_sim.sglang.env import (
    HUGEPAGE,
    HUGEPAGE_SIZE,
    NUMA_NODE,
    PREFAULT,
    EnvVarError,
    HostAllocEnv,
    parse_env,
    sglang_env_failure,
    sglang_parse_env,
)


def test_defaults() -> None:
    expect = HostAllocEnv(True, 2097152, -1, True, ())
    assert parse_env({}) == expect
    assert sglang_parse_env({}) == expect


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("1", True),
        ("true", True),
        (" TRUE ", True),
        ("Yes", True),
        ("on", True),
        ("0", False),
        ("off", False),
        ("no", False),
        ("false", False),
        ("", False),  # set but empty: sglang reads off, not the default
        ("enabled", False),
        ("2", False),
    ],
)
def test_bool_parsing_matches_sglang(raw: str, value: bool) -> None:
    for name, field in ((HUGEPAGE, "use_hugepage"), (PREFAULT, "prefault")):
        assert getattr(sglang_parse_env({name: raw}), field) is value
        assert getattr(parse_env({name: raw}), field) is value


def test_bool_surprises_are_warned() -> None:
    env = parse_env({HUGEPAGE: "enabled", PREFAULT: ""})
    assert env.use_hugepage is False and env.prefault is False
    assert env.warnings == (
        "SGLANG_HICACHE_HOST_HUGEPAGE='enabled' is not one of 1/true/yes/on "
        "(or 0/false/no/off): sglang reads it as off",
        "SGLANG_HICACHE_HOST_PREFAULT='' is not one of 1/true/yes/on (or 0/false/no/off): "
        "sglang reads it as off",
    )
    assert parse_env({HUGEPAGE: "Off", PREFAULT: "1"}).warnings == ()


@pytest.mark.parametrize(
    ("raw", "value"),
    [("1073741824", 1073741824), (" 2097152\n", 2097152), ("+4096", 4096), ("2_097_152", 2097152)],
)
def test_int_parsing_is_python_int(raw: str, value: int) -> None:
    assert sglang_parse_env({HUGEPAGE_SIZE: raw}).hugepage_size == value
    assert parse_env({HUGEPAGE_SIZE: raw}).hugepage_size == value


def test_empty_int_means_default_and_negative_passes_through() -> None:
    assert parse_env({HUGEPAGE_SIZE: "", NUMA_NODE: ""}) == HostAllocEnv()
    # sglang does not validate the numbers: the allocator gets them.
    assert parse_env({NUMA_NODE: "-7", HUGEPAGE_SIZE: "3000000"}).numa_node == -7
    assert parse_env({HUGEPAGE_SIZE: "3000000"}).hugepage_size == 3000000


def test_sglang_raises_bare_value_error() -> None:
    with pytest.raises(ValueError) as ei:
        sglang_parse_env({HUGEPAGE_SIZE: "2M"})
    assert type(ei.value) is ValueError
    assert str(ei.value) == "invalid literal for int() with base 10: '2M'"


def test_umbp_sim_error_names_the_variable() -> None:
    with pytest.raises(EnvVarError) as ei:
        parse_env({HUGEPAGE_SIZE: "2M"})
    e = ei.value
    assert isinstance(e, UmbpSimError) and isinstance(e, ValueError)
    assert (e.variable, e.value, e.exit_code) == (HUGEPAGE_SIZE, "2M", 64)
    assert str(e) == (
        "SGLANG_HICACHE_HOST_HUGEPAGE_SIZE='2M' is not an integer: sglang parses it with int() "
        "and the server dies with ValueError at startup; use bytes, e.g. "
        "SGLANG_HICACHE_HOST_HUGEPAGE_SIZE=2097152"
    )
    with pytest.raises(EnvVarError) as ei:
        parse_env({HUGEPAGE_SIZE: "huge"})
    assert str(ei.value).endswith(
        "use a number of bytes such as 2097152 (2 MiB) or 1073741824 (1 GiB)"
    )
    with pytest.raises(EnvVarError) as ei:
        parse_env({NUMA_NODE: "node1"})
    assert str(ei.value) == (
        "SGLANG_HICACHE_HOST_NUMA_NODE='node1' is not an integer: sglang parses it with int() "
        "and the server dies with ValueError at startup; use a node number such as 0, or -1 "
        "for no binding"
    )


def test_sglang_env_failure_report() -> None:
    assert sglang_env_failure({}) is None
    assert sglang_env_failure({HUGEPAGE: "bogus", NUMA_NODE: "1"}) is None
    f = sglang_env_failure({HUGEPAGE_SIZE: "2M", NUMA_NODE: "x"})
    assert f is not None
    # sglang reads HUGEPAGE_SIZE first: that is the error its log shows.
    assert (f.variable, f.value) == (HUGEPAGE_SIZE, "2M")
    assert f.exception_type == "ValueError"
    assert f.error == "ValueError: invalid literal for int() with base 10: '2M'"
    assert f.falls_back is False
    assert "server dies" in f.consequence
    g = sglang_env_failure({NUMA_NODE: " "})
    assert g is not None and g.variable == NUMA_NODE
    assert g.error == "ValueError: invalid literal for int() with base 10: ' '"


def test_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NUMA_NODE, "1")
    monkeypatch.setenv(HUGEPAGE, "0")
    env = parse_env()
    assert (env.numa_node, env.use_hugepage) == (1, False)
    monkeypatch.setenv(HUGEPAGE_SIZE, "1G")
    with pytest.raises(EnvVarError, match="SGLANG_HICACHE_HOST_HUGEPAGE_SIZE=1073741824$"):
        parse_env()
