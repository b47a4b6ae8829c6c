"""Progress of long work (issue 18, item 7): drawn on a terminal, quiet in CI or when piped."""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from umbp_sim.progress import Progress, track, wanted


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def no_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CI", "UMBP_SIM_PROGRESS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm")


def test_terminal_gets_a_line_redrawn_in_place_then_erased(no_ci: None) -> None:
    out = FakeTerminal()
    with Progress("replaying", total=3, stream=out, interval=0) as p:
        for host in ["a", "bb", "c"]:
            p.advance(host)
    assert out.getvalue() == (
        "\rreplaying 1/3 a" + "\rreplaying 2/3 bb" + "\rreplaying 3/3 c " + "\r" + " " * 15 + "\r"
    )


def test_redraws_are_throttled_but_the_last_item_is_drawn(no_ci: None) -> None:
    out = FakeTerminal()
    with Progress("n", total=1000, stream=out, interval=60) as p:
        for _ in range(1000):
            p.advance()
    assert out.getvalue() == "\rn 1/1000" + "\rn 1000/1000" + "\r" + " " * 11 + "\r"


@pytest.mark.parametrize(
    ("env", "tty", "expected"),
    [
        ({}, True, True),
        ({}, False, False),  # piped
        ({"CI": "true"}, True, False),
        ({"TERM": "dumb"}, True, False),
        ({"UMBP_SIM_PROGRESS": "0"}, True, False),
        ({"UMBP_SIM_PROGRESS": "1"}, False, True),
        ({"UMBP_SIM_PROGRESS": "1", "CI": "true"}, False, True),
    ],
)
def test_when_it_is_drawn(
    no_ci: None, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], tty: bool, expected: bool
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    stream = FakeTerminal() if tty else io.StringIO()
    assert wanted(stream) is expected
    with Progress("x", stream=stream, interval=0) as p:
        p.advance()
    assert (stream.getvalue() != "") is expected


def test_track_counts_every_item(no_ci: None) -> None:
    out = FakeTerminal()
    assert list(track(["a", "b"], "items", stream=out)) == ["a", "b"]
    assert "items 1/2" in out.getvalue()


CHILD = "from umbp_sim.progress import track\nfor _ in track(range(3), 'work'): pass\nprint('ok')\n"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "UMBP_SIM_PROGRESS")}
    env.update(TERM="xterm", PYTHONSAFEPATH="1", **extra)
    return env


def test_a_real_terminal_sees_it_and_a_pipe_does_not() -> None:
    piped = subprocess.run([sys.executable, "-c", CHILD], env=_env(), capture_output=True,
                           text=True, timeout=60)  # fmt: skip
    assert (piped.stdout, piped.stderr) == ("ok\n", "")

    pid, fd = pty.fork()
    if pid == 0:  # the child: stdout and stderr are the pty
        os.execve(sys.executable, [sys.executable, "-c", CHILD], _env())
    seen = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    os.waitpid(pid, 0)
    os.close(fd)
    assert b"work 3/3" in seen
    assert seen.rstrip().endswith(b"ok")

    in_ci = subprocess.run([sys.executable, "-c", CHILD], env=_env(CI="true"),
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert in_ci.stderr == ""


# ---- the long commands: compare, a fleet replay, explore ------------------------------------
REPLAY = Path(__file__).parent / "data" / "replay"
LONG_WORK = {
    "compare": (["compare", "umbp-sim", "umbp-sim", "--no-scenarios", "-k", "*no-pool k6.8.0*"],
                "compare: runs "),
    "fleet replay": (["replay", str(REPLAY / "no-pool-512g"), str(REPLAY / "pool-on-node0-6.8.0"),
                      "--size", "1GiB", "--json"], "replay: hosts "),
}  # fmt: skip


@pytest.mark.parametrize(
    ("env", "tty", "drawn"),
    [({}, True, True), ({"CI": "true"}, True, False), ({}, False, False)],
    ids=["terminal", "ci", "piped"],
)
@pytest.mark.parametrize("work", list(LONG_WORK))
def test_long_commands_show_progress_only_on_a_terminal(
    no_ci: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    work: str,
    env: dict[str, str],
    tty: bool,
    drawn: bool,
) -> None:
    from umbp_sim.cli import main

    argv, label = LONG_WORK[work]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    stderr = FakeTerminal() if tty else io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    assert main(argv) in (0, 1)
    capsys.readouterr()
    text = stderr.getvalue()
    if drawn:
        # drawn in place, the last count complete, then erased
        assert f"\r{label}" in text
        assert re.search(rf"\r{label}(\d+)/\1", text), text
        assert text.endswith("\r")
    else:
        assert text == ""


@pytest.mark.parametrize(("ci", "drawn"), [(False, True), (True, False)], ids=["terminal", "ci"])
def test_explore_shows_progress_only_on_a_terminal(
    no_ci: None, monkeypatch: pytest.MonkeyPatch, ci: bool, drawn: bool
) -> None:
    from hypothesis import HealthCheck, settings
    from hypothesis.stateful import run_state_machine_as_test

    from umbp_sim.explore import stateful

    if ci:
        monkeypatch.setenv("CI", "true")
    stderr = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", stderr)
    monkeypatch.setattr(stateful, "_PROGRESS", [])  # a fresh line, drawn on this stderr
    monkeypatch.setattr("atexit.register", lambda fn: fn)
    run_state_machine_as_test(
        stateful.AllocatorStateMachine,
        settings=settings(max_examples=3, stateful_step_count=3, database=None, deadline=None,
                          suppress_health_check=list(HealthCheck)),
    )  # fmt: skip
    (line,) = stateful._PROGRESS
    assert line.enabled is drawn
    assert line.done >= 3  # a schedule per example
    assert ("explore: " in stderr.getvalue()) is drawn
    assert (stderr.getvalue() == "") is not drawn
