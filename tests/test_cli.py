"""The command-line dispatcher: usage errors and a closed pipe."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from umbp_sim.cli import main

DUMP = Path(__file__).parent / "data" / "machines" / "64amd64-4s2n4ca2co.tar.bz2"


def test_unknown_command_is_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["no-such-command"])
    assert e.value.code == 64
    assert "invalid choice: 'no-such-command'" in capsys.readouterr().err


def test_closed_pipe_is_quiet() -> None:
    # The reader of `umbp-sim inspect ... | head` is gone before the command writes.
    proc = subprocess.Popen(
        [sys.executable, "-P", "-c", "import sys; from umbp_sim.cli import main; "
         f"sys.exit(main(['inspect', {str(DUMP)!r}, '--json']))"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_a_broken_pipe_that_is_not_stdout_is_not_an_answer() -> None:
    # A worker or server pipe that broke must not pass for `| head`: exit 0 would say "same".
    code = (
        "import os, sys\n"
        "from umbp_sim import cli\n"
        "def run(args):\n"
        "    r, w = os.pipe()\n"
        "    os.close(r)\n"
        "    os.write(w, b'x')  # EPIPE: BrokenPipeError (SIGPIPE is ignored by Python)\n"
        "import umbp_sim.commands.profiles as p\n"
        "p.run = run\n"
        "sys.exit(cli.main(['profiles']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 70, proc.stderr
    assert proc.stderr.startswith("umbp-sim profiles: internal error: BrokenPipeError: ")
    assert proc.stdout == ""
