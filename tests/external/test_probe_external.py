"""``umbp-sim probe --allocator SPEC``: an external build's allocation of each backing on the
real kernel, an engine ``Measure`` run in a forked run of its server (the interposer off)."""

from __future__ import annotations

import pytest

from umbp_sim.cli import main


def _rows(out: str) -> dict[str, list[str]]:
    lines = out.splitlines()
    assert lines[0].startswith("requested")
    return {line.split()[0]: line.split()[1:] for line in lines[1:5]}


def test_an_external_build_probes_as_the_builtin_allocator_on_an_empty_pool(
    nr_hugepages, tiny_builds, capsys
):
    # The test allocator falls back from hugetlb as umbp-sim's does: the same buffers, measured
    # on this kernel (its warning texts are its own).
    assert nr_hugepages(0) == 0
    assert main(["probe", "--size", "4MiB", "--allocator", "umbp-sim"]) == 1
    builtin = _rows(capsys.readouterr().out)
    assert main(["probe", "--size", "4MiB", "--allocator", tiny_builds["wrap"]]) == 1
    external = _rows(capsys.readouterr().out)
    assert {k: v[:5] for k, v in external.items()} == {k: v[:5] for k, v in builtin.items()}
    assert external["AnonymousHugetlb"][1] == "Anonymous"


def test_a_missing_build_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["probe", "--allocator", str(tmp_path / "gone.so")])
    assert e.value.code == 64
    assert "gone.so" in capsys.readouterr().err
