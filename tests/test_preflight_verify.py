"""``umbp-sim preflight REQUEST --verify``: the prediction against the real allocation.

The realkernel cases (run by ``tox -e realkernel`` and the plain suite; root) allocate for real
in a child process: anonymous and shm buffers, and hugetlb ones with a 2 MiB pool this test
sets and restores (the ``nr_hugepages`` fixture), under both allocator profiles.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from umbp_sim import Machine, cli
from umbp_sim.commands import preflight
from umbp_sim.diagnose import verify as verify_mod
from umbp_sim.diagnose.verify import Side

pytestmark = pytest.mark.realkernel

MiB = 1 << 20
PROFILES = ("mori-624002c", "umbp-sim")


def run_verify(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    code = cli.main(["preflight", *args, "--verify", "--json"])
    return code, json.loads(capsys.readouterr().out)


def assert_agree(v: dict, backing: str, page: int, rss: int, node: int = -1) -> None:
    assert v["agree"] is True and v["first_disagreement"] is None
    for side in ("predicted", "real"):
        s = v[side]
        assert (s["outcome"], s["actual_backing"], s["page_size"], s["rss"], s["node"]) == (
            "ok",
            backing,
            page,
            rss,
            node,
        ), side
    if rss:
        assert set(v["real"]["pages_on_nodes"]) == {"0"}  # this host's memory is on node 0


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize(("flag", "backing"), [("anonymous", "Anonymous"), ("shm", "AnonymousShm")])
def test_verify_anonymous_and_shm_agree(
    capsys: pytest.CaptureFixture[str], profile: str, flag: str, backing: str
) -> None:
    code, out = run_verify(capsys, "--size", "64MiB", "--backing", flag, "--allocator", profile)
    assert code == 0
    assert out["verify"]["allocator"] == profile
    assert_agree(out["verify"], backing, 4096, 64 * MiB)
    code, out = run_verify(capsys, "--size", "8MiB", "--backing", flag, "--no-prefault")
    assert code == 0
    assert_agree(out["verify"], backing, 4096, 0)  # nothing touched: no RSS


@pytest.mark.parametrize("profile", PROFILES)
def test_verify_hugetlb_with_a_pool_agrees(
    capsys: pytest.CaptureFixture[str], nr_hugepages, profile: str
) -> None:
    if nr_hugepages(40) != 40:
        pytest.fail("cannot set up a pool of 40 x 2 MiB pages")
    for flag, backing in (("hugetlb", "AnonymousHugetlb"), ("shm-hugetlb", "AnonymousShmHugetlb")):
        code, out = run_verify(
            capsys, "--size", "64MiB", "--backing", flag, "--numa-node", "0", "--allocator", profile
        )
        assert code == 0, out["verify"]
        assert_agree(out["verify"], backing, 2 * MiB, 64 * MiB, node=0)
    # an empty pool: both sides demote to 4 KiB pages (exit 1: demoted, not 3)
    assert nr_hugepages(0) == 0
    code, out = run_verify(
        capsys, "--size", "16MiB", "--backing", "hugetlb", "--allocator", profile
    )
    v = out["verify"]
    assert code == 1 and v["agree"], v
    assert v["predicted"]["outcome"] == v["real"]["outcome"] == "demoted"
    assert v["real"]["actual_backing"] == "Anonymous" and v["real"]["page_size"] == 4096


def test_verify_text_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["preflight", "--size", "4MiB", "--backing", "anonymous", "--verify"])
    text = capsys.readouterr().out
    assert code == 0
    tail = text.split("\n\nverify: ")[1].splitlines()
    assert tail[0] == (
        "alloc(4194304 bytes = 4MiB, backing Anonymous, hugepage_size 2MiB, numa_node -1, "
        "prefault on), "
        "allocator mori-624002c, in a child process (freed)"
    )
    assert tail[1].split() == ["predicted", "real", "(this", "host)"]
    assert tail[2].split() == ["outcome", "ok", "ok"]
    assert tail[3].split() == ["backing", "Anonymous", "Anonymous"]
    assert tail[4].split() == ["node", "none", "none", "(pages", "on", "N0)"]
    assert tail[5].split() == ["page", "size", "4KiB", "4KiB"]
    assert tail[6].split() == ["RSS", "4MiB", "4MiB"]
    assert tail[7] == "prediction and reality agree"


def test_disagreement_names_the_first_field_and_exits_3(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # reality differs from the prediction in backing and page size: backing comes first
    fake = Side("ok", "AnonymousHugetlb", -1, 2 * MiB, 4 * MiB, {0: 2})
    monkeypatch.setattr(verify_mod, "perform", lambda d: fake)
    code = cli.main(["preflight", "--size", "4MiB", "--backing", "anonymous", "--verify"])
    text = capsys.readouterr().out
    assert code == 3
    assert text.splitlines()[-1] == "first disagreement: backing (exit 3)"
    fake = Side("ok", "Anonymous", -1, 4096, 1 * MiB, {0: 256})
    monkeypatch.setattr(verify_mod, "perform", lambda d: fake)
    code, out = run_verify(capsys, "--size", "4MiB", "--backing", "anonymous")
    assert code == 3 and out["verify"]["first_disagreement"] == "rss"
    # bound to node 0 but pages found on node 1
    v = verify_mod.Verification(
        "r", "a", Side("ok", "Anonymous", 0, 4096, 4096), Side("ok", "Anonymous", 0, 4096, 4096,
                                                               {0: 1, 1: 1}), 0
    )  # fmt: skip
    assert v.disagreement == "node" and v.exit_code == 3


def test_refusals_are_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def never(d):  # type: ignore[no-untyped-def]
        raise AssertionError("performed")

    monkeypatch.setattr(verify_mod, "perform", never)
    code = cli.main(["preflight", "--size", "2GiB", "--backing", "anonymous", "--verify"])
    assert code == 64
    assert capsys.readouterr().err == (
        "umbp-sim preflight: --verify: 2GiB is above the cap of 1GiB (--verify-max-size to "
        "raise it)\n"
    )
    code = cli.main(["preflight", "--root", str(tmp_path), "--size", "1MiB", "--verify"])
    assert code == 64
    assert capsys.readouterr().err == (
        "umbp-sim preflight: --verify cannot be combined with --root: it allocates on this host\n"
    )
    sglang = ["--model-layers", "2", "--kv-heads", "1", "--head-dim", "64", "--hicache-size", "1"]
    assert cli.main(["preflight", *sglang, "--verify"]) == 64
    assert capsys.readouterr().err == (
        "umbp-sim preflight: --verify: performs raw requests only (--size ...), not sglang's pool\n"
    )
    # a host where the prediction is an OOM kill: refused, the prediction printed
    small = Machine.x86_64(nodes=1, mem_per_node="4GiB")
    small.overcommit_memory = 1
    monkeypatch.setattr(preflight, "live_host", lambda: (small, None))
    args = ["preflight", "--size", "8GiB", "--backing", "anonymous", "--verify"]
    assert cli.main([*args, "--verify-max-size", "16GiB"]) == 64
    out, err = capsys.readouterr()
    assert "crashed" in out
    assert err == (
        "umbp-sim preflight: --verify: the prediction is an OOM kill (killed by SIGKILL during "
        "madvise(MADV_POPULATE_WRITE) of node 0: out of memory on node(s) 0: OOM kill); not "
        "performed (--force to perform it anyway)\n"
    )
    # --force performs it (here: the fake child says what the kernel did)
    monkeypatch.setattr(verify_mod, "perform", lambda d: Side("crashed", error="SIGKILL"))
    assert cli.main([*args, "--verify-max-size", "16GiB", "--force"]) == 2
    assert capsys.readouterr().out.splitlines()[-1] == "prediction and reality agree"


def test_child_measures_the_buffer_in_process() -> None:
    """The child's measurement, run here: a 4 MiB anonymous buffer, prefaulted, then not."""
    from umbp_sim.engine.measure import measure_builtin
    from umbp_sim.request import AllocRequest

    req = AllocRequest(4 * MiB, "Anonymous", 2 * MiB, -1, True)
    r = measure_builtin(req, "umbp-sim")
    assert (r.outcome, r.actual_backing, r.bound_node, r.page_size, r.rss) == (
        "ok",
        "Anonymous",
        -1,
        4096,
        4 * MiB,
    )
    assert r.pages_on == {0: r.pages_on[0]} and r.pages_on[0] >= 1024
    r = measure_builtin(dataclasses.replace(req, prefault=False), "umbp-sim")
    assert r.rss == 0
    r = measure_builtin(dataclasses.replace(req, size=0), "umbp-sim")
    assert (r.outcome, r.failure) == ("failed", "invalid") and str(r.error).startswith(
        "RuntimeError: UMBPHostMemAllocator.alloc(0 bytes) failed"
    )
