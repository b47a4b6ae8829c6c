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
