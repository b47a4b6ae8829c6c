"""Without torch, what needs it says so in one line (the `notorch` configuration runs this)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from umbp_sim.cli import main

SCENARIO = Path(__file__).parent.parent / "scenarios" / "sglang" / "worked-example-100gb.toml"


def test_sglang_scenario_without_torch_is_one_clear_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # "import torch" raises ImportError
    assert main(["run", str(SCENARIO)]) == 65
    err = capsys.readouterr().err.strip()
    assert err == (
        "umbp-sim run: torch is required for UMBPHostTensorAllocator "
        "(install torch, e.g. pip install 'umbp-sim[torch]')"
    )
