"""``umbp-sim probe`` on the real kernel."""

from __future__ import annotations

import pytest

from umbp_sim.cli import main
from umbp_sim.commands import probe as probe_cmd


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
