"""replay/preflight bad input: one line naming the file, line or flag; exit 64 or 65."""

from __future__ import annotations

from pathlib import Path

import pytest

from umbp_sim.cli import main

D = Path(__file__).parent / "data" / "replay"
GOOD = str(D / "no-pool-512g")


def run(capsys, argv: list[str]) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    try:
        code = main(argv)
    except SystemExit as e:  # argparse
        code = int(e.code or 0)
    err = capsys.readouterr().err
    return code, err


@pytest.mark.parametrize(
    ("argv", "code", "text"),
    [
        (["--size", "12XB"], 64, "argument --size: cannot read size '12XB'"),
        (["--size", "1GiB", "--backing", "huge"], 64, "argument --backing: unknown backing 'huge'"),
        (["--size", "1GiB", "--model-layers", "32"], 64,
         "--size cannot be combined with --model-layers"),
        (["--size", "1GiB", "--env", "SGLANG_HICACHE_HOST_NUMA_NODE=0"], 64,
         "--env SGLANG_HICACHE_HOST_NUMA_NODE: applies to sglang requests only"),
        ([], 64, "no request: give --size"),
        (["--error", "RuntimeError: UMBPHostMemAllocator.alloc(1073741824 bytes) failed "
          "(requested_backing=AnonymousHugetlb, numa_node=0)", "--model-layers", "32"], 64,
         "--error cannot be combined with --model-layers: the error line is the request"),
        (["--model-layers", "32", "--kv-heads", "8", "--head-dim", "128", "--hicache-size", "1",
          "--layout", "bogus"], 64, "--layout: Unsupported layout: bogus"),
        (["--model-layers", "32", "--kv-heads", "8", "--head-dim", "128", "--hicache-size", "1",
          "--env", "FOO=1"], 64, "--env FOO: not one of SGLANG_HICACHE_HOST_HUGEPAGE"),
        (["--model-layers", "32", "--kv-heads", "8", "--hicache-size", "1"], 64,
         "--head-dim: required for an MHA model"),
        (["--model-layers", "32", "--kv-heads", "8", "--kv-lora-rank", "512", "--hicache-size",
          "1"], 64, "--kv-heads cannot be combined with --kv-lora-rank"),
        (["--model-layers", "0", "--kv-heads", "8", "--head-dim", "128", "--hicache-size", "1"],
         64, "--model-layers: must be > 0, got 0"),
    ],
)  # fmt: skip
def test_bad_flags(capsys, argv: list[str], code: int, text: str) -> None:  # type: ignore[no-untyped-def]
    got, err = run(capsys, ["replay", GOOD, *argv])
    assert got == code
    assert text in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_malformed_meminfo_names_file_and_line(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "meminfo"
    bad.write_text("MemTotal:  1000 kB\nMemFree: lots kB\n")
    code, err = run(capsys, ["replay", str(bad), "--size", "1GiB"])
    assert code == 65
    assert str(bad) in err and ":2" in err
    assert err.count("\n") == 1


def test_truncated_tarball(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    src = Path(__file__).parent / "data" / "machines" / "32intel64-2p8co2t+8ve.tar.bz2"
    cut = tmp_path / "cut.tar.bz2"
    cut.write_bytes(src.read_bytes()[:2000])
    code, err = run(capsys, ["replay", str(cut), "--size", "1GiB"])
    assert code == 65
    assert err == (
        f"umbp-sim replay: {cut}: cut short: the bzip2 data ends before its stream does (after 0 "
        "bytes unpacked); the files after that point are missing\n"
    )
    assert err.count("\n") == 1


def test_missing_dump_and_preflight_root(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    code, err = run(capsys, ["replay", str(tmp_path / "nope"), "--size", "1GiB"])
    assert code == 66 and "no such file or directory" in err
    code, err = run(capsys, ["preflight", "--root", str(tmp_path), "--size", "1GiB"])
    assert code == 65 and "not a machine dump" in err
    code, err = run(capsys, ["preflight", "--size", "12XB"])
    assert code == 64 and "argument --size" in err
