"""``umbp-sim probe`` on the real kernel."""

from __future__ import annotations

import re

import pytest

from umbp_sim.cli import main
from umbp_sim.commands import probe as probe_cmd
from umbp_sim.engine.record import RunRecord


def rows(out: str) -> dict[str, list[str]]:
    lines = out.splitlines()
    assert lines[0].split() == [
        "requested",
        "size",
        "actual",
        "backing",
        "alignment",
        "mapped",
        "size",
        "node",
        "warnings",
    ]
    return {line.split()[0]: line.split()[1:] for line in lines[1:5]}


def test_probe_table_with_empty_pool(nr_hugepages, capsys):
    assert nr_hugepages(0) == 0
    # hugetlb was demoted: not what was asked for (README's exit table: 1)
    assert main(["probe", "--size", "4097", "--numa-node", "0"]) == 1
    out = capsys.readouterr().out
    assert rows(out) == {
        "Anonymous": ["4097B", "Anonymous", "4KiB", "8KiB", "0", "-"],
        "AnonymousHugetlb": ["4097B", "Anonymous", "4KiB", "8KiB", "0", "[1]"],
        "AnonymousShm": ["4097B", "AnonymousShm", "4KiB", "8KiB", "0", "-"],
        "AnonymousShmHugetlb": ["4097B", "AnonymousShm", "4KiB", "8KiB", "0", "[2]"],
    }
    assert out.splitlines()[5:] == [
        "[1] hugetlb mmap of 2097152 bytes (2048 kB pages) failed: ENOMEM; HugePages of 2048 kB: "
        "free 0, total 0, reserved 0; falling back to 4 KiB pages (Anonymous)",
        "[2] hugetlb mmap of 2097152 bytes (2048 kB pages) failed: ENOMEM; HugePages of 2048 kB: "
        "free 0, total 0, reserved 0; falling back to 4 KiB pages (AnonymousShm)",
    ]


MORI_FALLBACK = (
    r"HostMemAllocator: MAP_HUGETLB allocation failed for size=4194304 hugepage_size=2097152 "
    r"\(12: Cannot allocate memory\); falling back to anonymous pages\. HugePages_Total: +0 "
    r"HugePages_Free: +0 Hugepagesize: +2048 kB"
)


def test_probe_on_the_field_profile_shows_what_moris_log_level_shows(
    nr_hugepages, capsys, monkeypatch
):
    # Each backing is an engine Measure run in a fresh process: mori's once-per-process
    # warning is each hugetlb backing's own, and mori's log hides it at its default level.
    assert nr_hugepages(0) == 0
    monkeypatch.delenv("MORI_UMBP_LOG_LEVEL", raising=False)
    monkeypatch.delenv("MORI_GLOBAL_LOG_LEVEL", raising=False)
    assert main(["probe", "--size", "4MiB", "--allocator", "mori"]) == 1
    out = capsys.readouterr().out
    assert rows(out) == {
        "Anonymous": ["4MiB", "Anonymous", "4KiB", "4MiB", "-", "-"],
        "AnonymousHugetlb": ["4MiB", "Anonymous", "4KiB", "4MiB", "-", "-"],
        "AnonymousShm": ["4MiB", "AnonymousShm", "4KiB", "4MiB", "-", "-"],
        "AnonymousShmHugetlb": ["4MiB", "AnonymousShm", "4KiB", "4MiB", "-", "-"],
    }
    assert out.splitlines()[5:] == []
    monkeypatch.setenv("MORI_UMBP_LOG_LEVEL", "warn")
    assert main(["probe", "--size", "4MiB", "--allocator", "mori"]) == 1
    out = capsys.readouterr().out
    assert rows(out)["AnonymousHugetlb"][-1] == "[1]"
    assert rows(out)["AnonymousShmHugetlb"][-1] == "[2]"
    notes = out.splitlines()[5:]
    assert len(notes) == 2
    for i, note in enumerate(notes, 1):
        assert re.fullmatch(rf"\[{i}\] {MORI_FALLBACK}", note), note


def test_probe_with_hugepages(nr_hugepages, capsys):
    assert nr_hugepages(4) == 4
    assert main(["probe", "--size", "2MiB", "--hugepage-size", "2MiB"]) == 0
    assert rows(capsys.readouterr().out) == {
        "Anonymous": ["2MiB", "Anonymous", "4KiB", "2MiB", "-", "-"],
        "AnonymousHugetlb": ["2MiB", "AnonymousHugetlb", "2MiB", "2MiB", "-", "-"],
        "AnonymousShm": ["2MiB", "AnonymousShm", "4KiB", "2MiB", "-", "-"],
        "AnonymousShmHugetlb": ["2MiB", "AnonymousShmHugetlb", "2MiB", "2MiB", "-", "-"],
    }


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--size", "64XB"], "umbp-sim probe: --size: cannot read size '64XB'"),
        (["--size", "-5"], "umbp-sim probe: --size: cannot read size '-5'"),
        (["--size", "0"], "umbp-sim probe: --size: must be at least 1 byte, got 0"),
        (["--hugepage-size", "2 MB x"], "umbp-sim probe: --hugepage-size: cannot read size"),
    ],
)
def test_probe_bad_size_is_one_line_exit_64(capsys, argv, message):
    assert main(["probe", *argv]) == 64
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(message)
    assert captured.err.count("\n") == 1


ROW = {"requested": "AnonymousHugetlb", "ok": True, "actual_backing": "AnonymousHugetlb", "node": 0}


@pytest.mark.parametrize(
    ("row", "numa_node", "verdict"),
    [
        ({}, -1, True),
        ({}, 0, True),
        ({"actual_backing": "Anonymous"}, -1, False),  # demoted
        ({"ok": False, "actual_backing": None, "node": None}, -1, False),
        ({"node": 1}, 0, False),  # not on the node asked for
        ({"requested": "Anonymous", "actual_backing": "Anonymous", "node": -1}, -1, True),
    ],
)
def test_probe_exit_is_whether_each_backing_got_what_it_asked(row, numa_node, verdict):
    assert probe_cmd.got_what_it_asked({**ROW, **row}, numa_node) is verdict


def test_probe_bad_node_is_argparse_exit_64(capsys):
    with pytest.raises(SystemExit) as e:
        main(["probe", "--numa-node", "x"])
    assert e.value.code == 64
    assert "--numa-node" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("rec", "said"),
    [
        (RunRecord("failed", failure="invalid"), "FAILED"),
        (RunRecord("crashed", signal="SIGBUS", simulated=False), "CRASHED (SIGBUS)"),
        (RunRecord("timeout", stage="alloc"), "TIMED OUT"),
        (RunRecord("could-not-run"), "NOT RUN"),
    ],
)
def test_a_backing_without_a_buffer_says_how_it_ended(rec, said):
    assert probe_cmd._failed_as(rec) == said
    row = {"requested": "AnonymousHugetlb", "size": 4096, "ok": False, "actual_backing": None,
           "alignment": None, "mapped_size": None, "node": None, "warnings": [],
           "failed_as": said}  # fmt: skip
    line = probe_cmd._table([row]).splitlines()[1]
    assert line.split(None, 2)[2].startswith(said + "  ")
    assert probe_cmd.got_what_it_asked(row, -1) is False


def test_probe_bad_allocator_is_argparse_exit_64(capsys):
    with pytest.raises(SystemExit) as e:
        main(["probe", "--allocator", "no-such-allocator"])
    assert e.value.code == 64
    err = capsys.readouterr().err
    assert "argument --allocator: unknown allocator profile 'no-such-allocator'" in err
