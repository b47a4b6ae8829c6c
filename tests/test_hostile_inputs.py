"""Hostile flags, scenario dump paths, collect's output file, units as written (issue 16 items
5-7, issue 18 item 5)."""

from __future__ import annotations

import json
import os
import re
import tarfile
from pathlib import Path

import pytest

from umbp_sim import cli
from umbp_sim.errors import UmbpSimError
from umbp_sim.vocabulary.units import Size, SizeError, format_size, parse_size

OK_MEMINFO = "MemTotal: 16777216 kB\nMemFree: 8388608 kB\n"
SG = ["--model-layers", "32", "--kv-heads", "8", "--head-dim", "128"]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        rc = cli.main(list(argv))
    except SystemExit as e:  # argparse's exit(64, ...)
        rc = int(e.code or 0)
    err = capsys.readouterr().err
    return rc, err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--size", "18446744073709551616"],
         "argument --size: 18446744073709551616 is beyond what the simulator holds (below 2^62 "
         "bytes)"),
        (["--size", "1GiB", "--numa-node", "2147483648"],
         "argument --numa-node: 2147483648 is not a node (-1, or 0..2147483647)"),
        ([*SG, "--hicache-size", "inf"], "argument --hicache-size: inf is not a finite number"),
        ([*SG, "--hicache-size", "nan"], "argument --hicache-size: nan is not a finite number"),
        ([*SG, "--hicache-size", "1e308"],
         "argument --hicache-size: 1e308 GB is beyond what the simulator holds (below 2^62 bytes)"),
        ([*SG, "--hicache-size", "1", "--hicache-ratio", "inf"],
         "argument --hicache-ratio: inf is not a finite number"),
        (["--model-layers", "9" * 5000, "--kv-heads", "8", "--head-dim", "1", "--hicache-size",
          "1"], "argument --model-layers: 999999999999999999999999... is not a usable integer"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("command", ["replay", "preflight"])
def test_flags_beyond_the_simulator_are_usage_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str, argv: list[str], message: str
) -> None:
    dump = tmp_path / "meminfo"
    dump.write_text(OK_MEMINFO)
    where = [str(dump)] if command == "replay" else ["--root", str(dump)]
    rc, err = run_cli(capsys, command, *where, *argv)
    assert rc == 64
    assert err == f"umbp-sim {command}: error: {message}\n"


def test_sglang_buffer_beyond_the_simulator(capsys: pytest.CaptureFixture[str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    dump = tmp_path / "meminfo"
    dump.write_text(OK_MEMINFO)
    big = ["--model-layers", "2000000000", "--kv-heads", "2000000000", "--head-dim", "2000000000"]
    rc, err = run_cli(capsys, "replay", str(dump), *big, "--hicache-size", "1")
    assert rc == 64
    assert err.startswith("umbp-sim replay: request: a host buffer of ")
    assert err.endswith(" bytes is beyond what the simulator holds (below 2^62 bytes)\n")
    rc, err = run_cli(capsys, "replay", str(dump), *SG, "--hicache-size", "1",
                      "--env", "SGLANG_HICACHE_HOST_NUMA_NODE=2147483648")  # fmt: skip
    assert (rc, err) == (
        64,
        "umbp-sim replay: --env SGLANG_HICACHE_HOST_NUMA_NODE=2147483648: beyond what the "
        "allocator takes (at most 2147483647)\n",
    )


def test_dump_values_beyond_the_simulator_exit_65(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    dump = tmp_path / "meminfo"
    dump.write_text("MemTotal: 18014398509481984 kB\n")
    for argv in (["replay", str(dump), "--size", "1GiB"],
                 ["preflight", "--root", str(dump), "--size", "1GiB"]):  # fmt: skip
        rc, err = run_cli(capsys, *argv)
        assert (rc, err) == (
            65,
            f"umbp-sim {argv[0]}: {dump}:1: MemTotal 18014398509481984 kB is beyond what "
            "umbp-sim simulates (below 2^62 bytes)\n",
        )


def test_a_tool_failure_is_never_exit_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """preflight's 1 means "demoted": a bug inside the tool is 70 (EX_SOFTWARE), one line."""
    import umbp_sim.diagnose as diagnose

    def broken(*args: object) -> None:
        raise OverflowError("Python int too large to convert to C long\n(more)")

    monkeypatch.setattr(diagnose, "diagnose", broken)
    dump = tmp_path / "meminfo"
    dump.write_text(OK_MEMINFO)
    rc, err = run_cli(capsys, "preflight", "--root", str(dump), "--size", "1GiB")
    assert rc == 70
    assert err == (
        "umbp-sim preflight: internal error: OverflowError: Python int too large to convert to "
        "C long (more) (a bug in umbp-sim; UMBP_SIM_TRACEBACK=1 shows where)\n"
    )


def test_decimal_hugepage_size_says_what_was_meant(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    dump = tmp_path / "meminfo"
    dump.write_text(OK_MEMINFO)
    rc, err = run_cli(capsys, "replay", str(dump), "--size", "1GiB", "--hugepage-size", "2MB")
    assert (rc, err) == (
        64,
        "umbp-sim replay: --hugepage-size: 2MB is 2000000 bytes (MB is decimal); hugepage "
        "sizes are binary: did you mean 2MiB?\n",
    )


# ---- units (issue 18 item 5) ------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, value, unit",
    [
        ("100GB", 100 * 10**9, "GB"),
        ("100 gb", 100 * 10**9, "GB"),
        ("100GiB", 100 << 30, "GiB"),
        ("100G", 100 << 30, "G"),
        ("1.5GiB", 3 << 29, "GiB"),
        ("0.5GB", 5 * 10**8, "GB"),
        ("2048kB", 2 << 20, "kB"),  # the kernel's spelling: KiB
        ("2048KB", 2_048_000, "KB"),
        ("4096", 4096, ""),
        ("4096B", 4096, "B"),
        ("1TB", 10**12, "TB"),
        ("2.5K", 2560, "K"),
    ],
)
def test_units_as_written(text: str, value: int, unit: str) -> None:
    size = parse_size(text)
    assert (size, size.unit) == (value, unit)
    assert isinstance(size, Size) and isinstance(size, int)


@pytest.mark.parametrize("text", ["1.3B", "12XB", "-1GB", "1e9", "GB", "0.0000000001KB"])
def test_units_refused(text: str) -> None:
    with pytest.raises(SizeError):
        parse_size(text, "--size")


def test_sizes_print_in_the_unit_given() -> None:
    assert format_size(parse_size("100GB")) == "100GB"
    assert format_size(parse_size("1.5GiB")) == "1.5GiB"
    assert format_size(parse_size("2048kB")) == "2048kB"
    assert format_size(1_500_000_000, "GB") == "1.5GB"
    assert format_size(100000595968, "GB") == "~100.001GB"
    assert format_size(2 << 20) == "2MiB"  # no unit given: the shortest binary spelling
    assert str(parse_size("100GB")) == "100000000000"  # an int everywhere else (JSON, TOML)


def test_replay_describes_the_size_as_given(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    dump = tmp_path / "meminfo"
    dump.write_text(OK_MEMINFO)
    assert cli.main(["replay", str(dump), "--size", "1.5GiB", "--backing", "anonymous"]) == 0
    out = capsys.readouterr().out
    assert "alloc(1610612736 bytes = 1.5GiB, backing Anonymous" in out


# ---- scenario dump paths (item 5) ------------------------------------------------------------


def scenario(tmp_path: Path, dump: str) -> Path:
    p = tmp_path / "s" / "x.toml"
    p.parent.mkdir(exist_ok=True)
    p.write_text(
        f'[scenario]\nname = "x"\ndescription = "x"\n[machine]\ndump = "{dump}"\n'
        '[request]\nsize = "1GiB"\nbacking = "Anonymous"\n[expect]\noutcome = "ok"\n'
    )
    return p


def test_scenario_dump_rules(tmp_path: Path) -> None:
    from umbp_sim.scenario.scenario_run import run_scenario
    from umbp_sim.scenario.schema import ScenarioError, load_scenario

    secret = tmp_path / "s" / "shadow"
    secret.parent.mkdir()
    secret.write_text("root:$6$secret-line:19000\n")
    with pytest.raises(UmbpSimError) as exc:
        run_scenario(load_scenario(scenario(tmp_path, "shadow")))
    assert "secret-line" not in str(exc.value)
    assert "a bare meminfo file is not accepted here" in str(exc.value)

    (tmp_path / "s" / "link").symlink_to(tmp_path / "dumps")
    with pytest.raises(ScenarioError, match=r"\[machine\]\.dump: .*link is a symbolic link"):
        load_scenario(scenario(tmp_path, "link/x.tar"))

    (tmp_path / "dumps" / "H" / "proc").mkdir(parents=True)
    (tmp_path / "dumps" / "H" / "proc" / "meminfo").write_text(OK_MEMINFO)
    # a dump beside the scenario directory: inside the scenario root it was collected from
    r = run_scenario(load_scenario(scenario(tmp_path, "../dumps/H"), root=tmp_path))
    assert r.passed, r.report()


@pytest.mark.parametrize("dump", ["/", "../../../../../../../..", "ROOT", "../dumps/H"])
def test_scenario_dump_outside_its_tree_is_refused(tmp_path: Path, dump: str) -> None:
    from umbp_sim.scenario.schema import ScenarioError, load_scenario

    (tmp_path / "dumps" / "H" / "proc").mkdir(parents=True)
    (tmp_path / "dumps" / "H" / "proc" / "meminfo").write_text(OK_MEMINFO)
    dump = dump.replace("ROOT", str(tmp_path / "dumps" / "H"))
    p = scenario(tmp_path, dump)
    resolved = os.path.normpath(os.path.join(p.parent, dump))
    with pytest.raises(ScenarioError) as exc:
        load_scenario(p)  # its tree: the directory holding it
    assert str(exc.value) == (
        f"{p}: [machine].dump: {resolved} is outside the scenario tree {p.parent} (a dump "
        "elsewhere is given on the command line: umbp-sim replay DUMP)"
    )


def test_run_collects_a_tree_whose_scenarios_share_its_dumps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from umbp_sim.scenario.bundled import bundled_scenarios_dir
    from umbp_sim.scenario.schema import load_scenario

    (tmp_path / "dumps" / "H" / "proc").mkdir(parents=True)
    (tmp_path / "dumps" / "H" / "proc" / "meminfo").write_text(OK_MEMINFO)
    p = scenario(tmp_path, "../dumps/H")
    assert cli.main(["run", str(tmp_path)]) == 0  # the tree given: its dumps/ is inside
    assert cli.main(["run", str(p)]) == 65  # the file alone: its tree is its directory
    assert f"{p}: [machine].dump: {tmp_path}/dumps/H is outside" in capsys.readouterr().err
    # the bundled library's dump-* scenarios, one file at a time, reach scenarios/dumps/
    field = bundled_scenarios_dir() / "field" / "dump-offline-node0-mbind-einval.toml"
    assert load_scenario(field).machine["dump"].parent == bundled_scenarios_dir() / "dumps"


# ---- collect's output file (item 6) ----------------------------------------------------------


def test_collect_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    from umbp_sim.live_dump import CollectError, collect

    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    out = tmp_path / "host.tar"
    # the old predictable temporary name planted as a link: never used
    (tmp_path / f"host.tar.tmp{os.getpid()}").symlink_to(victim)
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "meminfo").write_text(OK_MEMINFO)
    collect(str(out), "h", root=str(root))
    assert victim.read_text() == "precious\n"
    assert out.is_file() and not out.is_symlink()
    # the output itself a link: refused (issue 26), neither written through nor replaced
    out.unlink()
    out.symlink_to(victim)
    with pytest.raises(CollectError, match="a symbolic link, not a regular file: refused"):
        collect(str(out), "h", root=str(root))
    assert victim.read_text() == "precious\n" and out.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["victim", "host.tar", f"host.tar.tmp{os.getpid()}", "root"]
    )


def test_the_standalone_collector_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    """The stand-alone script (run as root, often into /tmp) writes the same safe way."""
    from umbp_sim.collect_scripts import standalone_collect as standalone

    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    out = tmp_path / "host.tar.gz"
    (tmp_path / f"host.tar.gz.tmp{os.getpid()}").symlink_to(victim)  # its old temporary name
    standalone.write_tar(str(out), "h", {"proc/meminfo": OK_MEMINFO.encode()})
    assert victim.read_text() == "precious\n"
    assert out.is_file() and not out.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["victim", "host.tar.gz", f"host.tar.gz.tmp{os.getpid()}"]
    )
    with tarfile.open(out) as tar:
        assert tar.extractfile("h/proc/meminfo").read() == OK_MEMINFO.encode()  # type: ignore[union-attr]
    out.unlink()
    out.symlink_to(victim)
    with pytest.raises(OSError, match="a symbolic link, not a regular file: refused"):
        standalone.write_tar(str(out), "h", {"proc/meminfo": OK_MEMINFO.encode()})
    assert victim.read_text() == "precious\n" and out.is_symlink()


# ---- control characters from dumps never reach the terminal raw (issue 26, point 10) --------

ESC = "\x1b"
RELEASE = f"6.8.0{ESC}]0;owned\x07\x9b2J\x7f"  # OSC retitle, BEL, C1 CSI, DEL
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")  # any control character but the newline


def hostile_dump(parent: Path) -> Path:
    d = parent / f"h{ESC}[31mred"
    (d / "proc" / "sys" / "kernel").mkdir(parents=True)
    (d / "proc" / "meminfo").write_text(OK_MEMINFO)
    (d / "proc" / "sys" / "kernel" / "osrelease").write_text(RELEASE + "\n")
    return d


def test_printable_escapes_controls_only() -> None:
    from umbp_sim.vocabulary.printable import printable

    assert printable(RELEASE) == "6.8.0\\x1b]0;owned\\x07\\x9b2J\\x7f"
    assert printable("a\tb\nc\x00é—✓") == "a\\x09b\\x0ac\\x00é—✓"
    assert printable("a\tb\nc\x1b", keep="\n\t") == "a\tb\nc\\x1b"


@pytest.mark.parametrize("json_out", [False, True])
def test_inspect_and_replay_escape_dump_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], json_out: bool
) -> None:
    d = hostile_dump(tmp_path)
    flags = ["--json"] if json_out else []
    for argv in (
        ["inspect", str(d)],
        ["replay", str(d), "--size", "1GiB", "--backing", "anonymous"],
        ["replay", str(tmp_path), "--size", "1GiB", "--backing", "anonymous"],  # a fleet
        ["preflight", "--root", str(d), "--size", "1GiB", "--backing", "anonymous"],
    ):
        rc = cli.main([*argv, *flags])
        out, err = capsys.readouterr()
        assert rc == 0, err
        if json_out:  # exact: json escapes control characters itself, nothing else does
            assert RAW.search(out) is None
            assert "\\u001b" in out and "\\x1b" not in out, (argv, out)
            if argv[0] == "inspect":
                assert json.loads(out)["kernel_version"] == RELEASE
        else:
            assert RAW.search(out + err) is None, (argv, out)
            assert "\\x1b" in out, (argv, out)


def test_errors_quoting_a_dump_are_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / f"bad{ESC}]0;t\x07"
    (d / "proc").mkdir(parents=True)
    (d / "proc" / "meminfo").write_text(f"MemTotal: 1 kB\nMem{ESC}[2JFree 1 kB\n")
    rc = cli.main(["inspect", str(d)])
    err = capsys.readouterr().err
    assert rc == 65
    assert RAW.search(err) is None and err.count("\n") == 1
    assert err.startswith("umbp-sim inspect: ") and "bad\\x1b]0;t\\x07/proc/meminfo:2: " in err


# ---- --html, --error -, --verify-max-size 0, --error sizes (issue 26, point 11) --------------

ERROR_LINE = (
    "RuntimeError: UMBPHostMemAllocator.alloc({} bytes) failed "
    "(requested_backing=UMBPHostBufferBacking.Anonymous, numa_node=0)."
)


def test_a_failed_compare_leaves_an_existing_page_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "page.html"
    page.write_text("old page\n")
    rc, err = run_cli(
        capsys, "compare", "umbp-sim", "json", "--jobs", "1", "--matrix", "none", "--html",
        str(page),
    )  # fmt: skip
    assert rc == 2 and "json: ImportError" in err
    assert page.read_text() == "old page\n"
    assert os.listdir(tmp_path) == ["page.html"]


def test_a_page_replaces_the_old_one_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from umbp_sim.diagnose.html_report import PageFile, ReportWriteError

    dump = tmp_path / "meminfo"
    dump.write_text(OK_MEMINFO)
    page = tmp_path / "page.html"
    page.write_text("old page\n")
    os.link(page, tmp_path / "second-name")  # written in place, it would change too
    argv = ["replay", str(dump), "--size", "1GiB", "--backing", "anonymous", "--html", str(page)]
    assert run_cli(capsys, *argv)[0] == 0
    assert page.read_text().startswith("<!DOCTYPE html>")
    assert (tmp_path / "second-name").read_text() == "old page\n"
    assert sorted(os.listdir(tmp_path)) == ["meminfo", "page.html", "second-name"]
    # opened before the work, never written: nothing happens to it
    PageFile(str(tmp_path / "second-name")).discard()
    assert (tmp_path / "second-name").read_text() == "old page\n"
    with pytest.raises(ReportWriteError, match=r"^--html .*/no/p.html: cannot write: No such"):
        PageFile(str(tmp_path / "no" / "p.html"))
    with pytest.raises(ReportWriteError, match=r"^--html .*: a directory, not a regular file: "
                       "refused$"):  # fmt: skip
        PageFile(str(tmp_path))


@pytest.mark.parametrize("kind", ["fifo", "dev-full", "dangling-link", "link"])
def test_an_output_file_is_checked_as_collect_checks_its_tarball(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """replay --html, compare --html and --junit: anything but a regular file (or a new one) is
    refused before the work, in one line (exit 73), and a link's target is never written."""
    dump = tmp_path / "meminfo"
    dump.write_text(OK_MEMINFO)
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    target, what = str(tmp_path / "out"), "a symbolic link"
    if kind == "fifo":
        os.mkfifo(target)
        what = "a FIFO"
    elif kind == "dev-full":
        target, what = "/dev/full", "a character device"
    else:
        Path(target).symlink_to(victim if kind == "link" else tmp_path / "gone")
    replay = ["replay", str(dump), "--size", "1GiB", "--backing", "anonymous"]
    compare = ["compare", "umbp-sim", "mori-624002c", "--no-scenarios", "-k", "*size=4096,*"]
    for argv, flag in ((replay, "--html"), (compare, "--html"), (compare, "--junit")):
        code = cli.main([*argv, flag, target])
        out = capsys.readouterr()
        assert (code, out.out) == (73, ""), argv
        assert out.err == f"umbp-sim {argv[0]}: {flag} {target}: {what}, not a regular file: " \
            "refused\n"  # fmt: skip
    assert victim.read_text() == "keep\n"
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["meminfo", "victim", *(["out"] * (kind != "dev-full"))]
    )


@pytest.mark.parametrize(
    "stdin, message",
    [
        (b"x" * (64 * 1024 + 1) + b"\n", "a line longer than 64 KiB (a paste of the traceback, "
         "not a log or a binary file)"),
        (b"y" * (200 << 20), "a line longer than 64 KiB (a paste of the traceback, not a log or a "
         "binary file)"),
        ((b"z" * 1000 + b"\n") * (17 * 1024), "more than 16 MiB (a paste of the traceback, not a "
         "whole log)"),
    ],
)  # fmt: skip
def test_error_from_stdin_is_bounded(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    stdin: bytes,
    message: str,
) -> None:
    import io

    dump = tmp_path / "meminfo"
    dump.write_text(OK_MEMINFO)
    stream = io.BytesIO(stdin)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(stream))
    rc, err = run_cli(capsys, "replay", str(dump), "--error", "-")
    assert (rc, err) == (64, f"umbp-sim replay: --error - (stdin): {message}\n")
    assert stream.tell() <= (16 << 20) + (64 << 10) + 2  # it stopped reading there


def test_error_from_stdin_still_reads_a_pasted_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    dump = tmp_path / "meminfo"
    dump.write_text(OK_MEMINFO)
    paste = "Traceback (most recent call last):\n  File x\n" + ERROR_LINE.format(1 << 30) + "\n"
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(paste.encode())))
    rc, err = run_cli(capsys, "replay", str(dump), "--error", "-")
    assert rc == 0, err


@pytest.mark.parametrize("size", [2**62, 2**63, 2**64 - 1, 2**64])
@pytest.mark.parametrize("backing", ["Anonymous", "AnonymousShmHugetlb"])
def test_error_line_sizes_from_2_62(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], size: int, backing: str
) -> None:
    """An --error line is what the server printed: any size_t is replayed (alloc(size_t(-1))
    is a field failure, every mmap of it fails before pages are counted), reproduced exactly;
    a number beyond size_t is no such line (README: the flags' 2^62 bound is for sizes typed)."""
    dump = tmp_path / "meminfo"
    dump.write_text(OK_MEMINFO)
    line = ERROR_LINE.format(size).replace("Backing.Anonymous,", f"Backing.{backing},")
    rc = cli.main(["replay", str(dump), "--error", line, "--json"])
    out, err = capsys.readouterr()
    if size >= 2**64:
        assert (rc, err) == (64, f"umbp-sim replay: --error: {size} bytes does not fit a size_t\n")
        return
    doc = json.loads(out)
    assert (rc, doc["outcome"], doc["reproduces_error_line"]) == (0, "failed", True), err


@pytest.mark.parametrize("cap", ["0", "0GiB", "0.0"])
def test_verify_max_size_zero_is_refused(capsys: pytest.CaptureFixture[str], cap: str) -> None:
    # 4 KiB: were 0 read as the 1 GiB default again, this would allocate only 4 KiB (and fail)
    rc, err = run_cli(
        capsys, "preflight", "--size", "4KiB", "--backing", "anonymous", "--verify",
        "--verify-max-size", cap,
    )  # fmt: skip
    assert (rc, err.splitlines()[-1]) == (
        64,
        f"umbp-sim preflight: error: argument --verify-max-size: {cap} allows no allocation "
        "(the largest size --verify may allocate, above 0; default 1GiB)",
    )
