"""umbp-sim preflight: the live host (this VM: 1 node) and --root dumps; exit 0/1/2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from umbp_sim.cli import main

D = Path(__file__).parent / "data" / "replay"
MACHINES = Path(__file__).parent / "data" / "machines"


def preflight(capsys, *argv: str) -> tuple[int, dict]:  # type: ignore[no-untyped-def]
    code = main(["preflight", *map(str, argv), "--allocator", "umbp-sim", "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_live_anonymous_request_fits(capsys) -> None:  # type: ignore[no-untyped-def]
    code, doc = preflight(capsys, "--size", "64MiB", "--backing", "anonymous")
    assert code == 0
    assert doc["outcome"] == "ok" and doc["actual_backing"] == "Anonymous"
    assert doc["fixes"] == [] and doc["machine"] == "live"


def test_live_hugetlb_request_is_demoted(capsys, nr_hugepages) -> None:  # type: ignore[no-untyped-def]
    nr_hugepages(0)  # the pool lock is held: no other test changes the pool meanwhile
    code, doc = preflight(capsys, "--size", "64MiB")
    assert code == 1
    assert doc["outcome"] == "demoted"
    assert doc["warnings"] == [
        "hugetlb mmap of 67108864 bytes (2048 kB pages) failed: ENOMEM; HugePages of 2048 kB: "
        "free 0, total 0, reserved 0; falling back to 4 KiB pages (Anonymous)"
    ]
    assert [(f["commands"], f["outcome_after"]) for f in doc["fixes"]] == [
        (["sysctl -w vm.nr_hugepages=32"], "ok: AnonymousHugetlb"),
        (["sysctl -w vm.nr_overcommit_hugepages=32"], "ok: AnonymousHugetlb"),
    ]
    # preflight never allocates: the live pool is untouched.
    assert Path("/proc/sys/vm/nr_hugepages").read_text().strip() == "0"


def test_live_text_matches_replay_format(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["preflight", "--size", "64MiB", "--backing", "anonymous"]) == 0
    out = capsys.readouterr().out
    assert "on live (kernel " in out
    assert "nothing: the request gets what it asks for on this host" in out
    # worded as a prediction: nothing has happened to a user yet
    assert out.startswith("preflight of alloc(67108864 bytes = 64MiB, backing Anonymous")
    assert "1. what the server will see\n" in out and "what the user saw" not in out


def test_root_dump_exit_codes(capsys) -> None:  # type: ignore[no-untyped-def]
    assert preflight(capsys, "--root", D / "pool-on-node0-6.8.0", "--size", "1GiB",
                     "--numa-node", "0")[0] == 0  # fmt: skip
    assert preflight(capsys, "--root", D / "pool-on-node0-6.8.0", "--size", "1GiB",
                     "--numa-node", "1")[0] == 1  # fmt: skip
    code, doc = preflight(capsys, "--root", D / "pool-on-node0-5.10.0", "--size", "1GiB",
                          "--numa-node", "1")  # fmt: skip
    assert code == 2 and doc["outcome"] == "crashed" and doc["signal"] == "SIGBUS"
    # Wrong node: allocated, but the binding is dropped: not what was asked.
    code, doc = preflight(capsys, "--root", D / "pool-on-node0-6.8.0", "--size", "1GiB",
                          "--numa-node", "3")  # fmt: skip
    assert code == 1 and doc["outcome"] == "ok" and doc["got_what_was_asked"] is False
    code, _ = preflight(capsys, "--root", MACHINES / "32intel64-2p8co2t+8ve.tar.bz2",
                        "--size", "4GiB")  # fmt: skip
    assert code == 0


@pytest.mark.torch  # start_host_pool makes torch tensors
def test_root_dump_sglang_request_fails_host_check(capsys) -> None:  # type: ignore[no-untyped-def]
    code, doc = preflight(capsys, "--root", D / "report1-7.05GB", "--model-layers", "32",
                          "--kv-heads", "8", "--head-dim", "128", "--page-size", "64",
                          "--device-pool-tokens", "26880")  # fmt: skip
    assert code == 2 and doc["outcome"] == "failed"
