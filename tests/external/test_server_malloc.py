"""The allocator's server runs its malloc on transparent hugepages (runner.MALLOC_THP), unless
the user's GLIBC_TUNABLES says otherwise; what the allocator asks of the host is unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from umbp_sim.allocator_spec import parse_allocator_spec
from umbp_sim.external.runner import MALLOC_THP, ExternalRunner, with_malloc_thp


def test_the_tunable_joins_the_users_others() -> None:
    assert with_malloc_thp({})["GLIBC_TUNABLES"] == MALLOC_THP
    env = with_malloc_thp({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    assert env["GLIBC_TUNABLES"] == f"glibc.malloc.arena_max=2:{MALLOC_THP}"


def test_the_users_own_choice_stands() -> None:
    env = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}
    assert with_malloc_thp(dict(env)) == env


def _server_environ(runner: ExternalRunner) -> dict[str, str]:
    assert runner.proc is not None
    raw = Path(f"/proc/{runner.proc.pid}/environ").read_bytes()
    return dict(e.split("=", 1) for e in raw.decode().split("\0") if "=" in e)


@pytest.mark.parametrize(
    ("given", "expected"),
    [(None, MALLOC_THP), ("glibc.malloc.hugetlb=0", "glibc.malloc.hugetlb=0")],
)
def test_the_server_process_has_it(
    tiny_builds: dict[str, str],
    given: str | None,
    expected: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    env = {} if given is None else {"GLIBC_TUNABLES": given}
    runner = ExternalRunner(parse_allocator_spec(tiny_builds["wrap"]), env=env)
    try:
        assert _server_environ(runner).get("GLIBC_TUNABLES") == expected
    finally:
        runner.close()
