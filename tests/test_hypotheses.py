"""An error line the dump does not reproduce: the host states a dump cannot show that give the
exact line, each verified by its own simulated run (umbp_sim/diagnose/hypotheses.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from umbp_sim.cli import main
from umbp_sim.diagnose import diagnose
from umbp_sim.diagnose.error_line import parse_error_line
from umbp_sim.diagnose.hypotheses import line_hosts
from umbp_sim.diagnose.replay_request import Request
from umbp_sim.diagnose.simulate import simulate_request
from umbp_sim.machine import Machine
from umbp_sim.request import AllocRequest

DATA = Path(__file__).parent / "data"
POOL_ON_NODE0 = DATA / "replay" / "pool-on-node0-6.8.0"


def line(size: int, node: int = -1, backing: str = "AnonymousHugetlb") -> str:
    return (
        f"RuntimeError: UMBPHostMemAllocator.alloc({size} bytes) failed "
        f"(requested_backing=UMBPHostBufferBacking.{backing}, numa_node={node})."
    )


def replay_json(capsys: pytest.CaptureFixture[str], *argv: Any) -> dict[str, Any]:
    assert main(["replay", *map(str, argv), "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def request_for(text: str) -> Request:
    el = parse_error_line(text)
    return Request(AllocRequest(el.size, el.backing, 2 << 20, el.numa_node, True), error_line=el)


def rerun(machine: Machine, request: Request, fields: dict[str, Any]) -> str | None:
    """The error a run on ``machine`` changed by ``fields`` ends with (checked independently of
    the search: its own Machine, its own run)."""
    changed = machine.copy()
    for k, v in fields.items():
        setattr(changed, k, v)
    return simulate_request(changed, request).observed.error


def test_an_unreproduced_line_gets_verified_hypotheses_at_their_edge(capsys) -> None:
    text = line(4 << 30, node=1)
    doc = replay_json(capsys, POOL_ON_NODE0, "--error", text)
    assert doc["outcome"] == "demoted" and doc["reproduces_error_line"] is False
    found = doc["hypotheses"]
    kinds = [h["kind"] for h in found["hypotheses"]]
    assert kinds[:2] == ["rlimit_as", "overcommit_mode"]
    for h in found["hypotheses"]:
        assert h["verified"]["reproduces_error_line"] is True, h
        assert h["verified"]["simulated"] == f"failed: {text}"
        assert h["collect"], h
        if h["beyond"] is not None:
            assert h["beyond"]["reproduces_error_line"] is False, h
    rlimit = found["hypotheses"][0]
    # The edge: the largest RLIMIT_AS in KiB below the 4 GiB mmap gives the line, 4 GiB does not.
    assert rlimit["verified"]["machine"] == {"rlimit_as": (4 << 30) - 1024}
    assert rlimit["beyond"]["machine"] == {"rlimit_as": 4 << 30}
    assert rlimit["beyond"]["outcome"] == "demoted"
    assert "collect --pid" in rlimit["collect"][0]
    mode = found["hypotheses"][1]
    committed = mode["verified"]["machine"]["committed_as"]
    assert mode["verified"]["machine"]["overcommit_memory"] == 2
    assert mode["beyond"]["machine"]["committed_as"] == committed - 4096
    assert "the dump shows 0" in mode["cause"]
    # What the dump cannot show but does not give the line: said, with what it gives instead.
    ruled = {t["change"].split(" (")[0]: t["outcome"] for t in found["ruled_out"]}
    assert ruled["a memory cgroup limit"] == "crashed"
    # Every simulation the search made is counted: the ones kept and the ones ruled out.
    shown = sum(1 + (h["beyond"] is not None) for h in found["hypotheses"])
    assert found["simulations"] >= shown + len(found["ruled_out"])


def test_hypotheses_are_checked_independently_of_the_search(capsys) -> None:
    from umbp_sim.dump import load_dump

    text = line(4 << 30, node=1)
    machine, facts = load_dump(POOL_ON_NODE0)
    request = request_for(text)
    d = diagnose(machine, facts, request)
    assert d.hypotheses is not None and d.hypotheses.hypotheses
    for h in d.hypotheses.hypotheses:
        assert rerun(machine, request, h.verified.fields) == text
        if h.beyond is not None:
            assert rerun(machine, request, h.beyond.fields) != text


def test_under_overcommit_2_the_committed_memory_comes_first() -> None:
    machine = Machine.x86_64(nodes=2, mem_per_node="32GiB", hugepages={"2MiB": 512})
    machine.overcommit_memory = 2
    machine.committed_as = 1 << 30
    text = line(8 << 30)
    request = request_for(text)
    d = diagnose(machine, None, request)
    assert d.run.outcome == "demoted"  # the dump's moment: 8 GiB fits the commit limit
    assert d.hypotheses is not None
    first = d.hypotheses.hypotheses[0]
    assert first.kind == "committed"
    least = first.verified.fields["committed_as"]
    assert rerun(machine, request, {"committed_as": least}) == text
    assert rerun(machine, request, {"committed_as": least - 4096}) != text
    assert "the dump shows 1 GiB" in first.cause and "CommitLimit" in first.cause


def test_a_reproduced_line_has_no_hypotheses(capsys) -> None:
    text = line(18446744073709551615)
    doc = replay_json(capsys, DATA / "replay" / "no-pool-512g", "--error", text)
    assert doc["reproduces_error_line"] is True and doc["hypotheses"] is None


def test_the_text_report_gives_the_hypotheses_before_the_dumps_causes(capsys) -> None:
    assert main(["replay", str(POOL_ON_NODE0), "--error", line(4 << 30, node=1)]) == 0
    out = capsys.readouterr().out
    why = out[out.index("2. why") : out.index("3. what to change")]
    assert "the host as dumped does not give the error line" in why
    assert "   a. the server's address-space limit (RLIMIT_AS, ulimit -v)" in why
    assert "      simulated: RLIMIT_AS 4194303 KiB (ulimit -v 4194303): the line, exactly" in why
    assert "      just past it: RLIMIT_AS 4194304 KiB (ulimit -v 4194304): demoted" in why
    assert "      to confirm: umbp-sim collect --pid PID" in why
    assert why.index("does not give the line (simulated):") < why.index("on the host as dumped:")


def test_every_held_back_dump_gets_a_verified_hypothesis(capsys) -> None:
    """A 1 GiB hugetlb line on each real dump, none of which gives it as dumped."""
    dumps = sorted(DATA.glob("machines/*.tar.bz2")) + sorted(
        p for p in (DATA / "replay").iterdir() if p.is_dir()
    )
    assert len(dumps) >= 15
    for dump in dumps:
        doc = replay_json(capsys, dump, "--error", line(1 << 30))
        assert doc["reproduces_error_line"] is False, dump
        kept = doc["hypotheses"]["hypotheses"]
        assert kept and all(h["verified"]["reproduces_error_line"] for h in kept), dump
        assert all(h["collect"] for h in kept), dump


def test_no_dump_lists_the_kinds_of_host_for_the_line(capsys) -> None:
    text = line(100000595968, node=3)
    doc = replay_json(capsys, "--error", text)
    assert doc["error_line"] == text
    assert "4 nodes" in doc["reference_host"]  # the node the line binds to exists
    kinds = [h["kind"] for h in doc["hypotheses"]]
    assert kinds == ["ram", "rlimit_as", "overcommit_mode"]
    assert all(h["verified"]["reproduces_error_line"] for h in doc["hypotheses"])
    assert doc["ruled_out"][0]["change"] == "none: the reference host as it is"
    assert doc["ruled_out"][0]["outcome"] == "demoted"
    assert main(["replay", "--error", text]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"hosts on which this line happens: {text}\n")
    assert "   a. a host whose RAM + swap is smaller than the request" in out


def test_no_dump_a_line_that_fails_on_any_host(capsys) -> None:
    doc = replay_json(capsys, "--error", line(0))
    assert [h["kind"] for h in doc["hypotheses"]] == ["any_host"]
    assert doc["simulations"] == 1
    machine, found = line_hosts(request_for(line(0)))
    assert found.hypotheses[0].cause.startswith("on any host: the allocator returns a null handle")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "DUMP: give the host's dump (umbp-sim collect), or --error LINE alone"),
        (["--error", line(1 << 30), "--html", "x.html"], "--html: a page is drawn for a dumped"),
    ],
)
def test_replay_without_a_dump_usage(capsys, tmp_path, argv, message) -> None:
    assert main(["replay", *argv]) == 64
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x.html").exists()


def test_the_page_shows_the_hypotheses(capsys, tmp_path) -> None:
    page = tmp_path / "replay.html"
    assert main(["replay", str(POOL_ON_NODE0), "--error", line(4 << 30, node=1), "--html",
                 str(page)]) == 0  # fmt: skip
    capsys.readouterr()
    html = page.read_text()
    why = html[html.index("<h2>2. why</h2>") : html.index("<h2>3. what to change</h2>")]
    assert why.count("<li>the server&#x27;s address-space limit (RLIMIT_AS") == 1
    assert "simulated: RLIMIT_AS 4194303 KiB (ulimit -v 4194303): the line, exactly" in why
    assert "<h3>does not give the line (simulated)</h3>" in why


def test_an_error_line_is_a_raw_request() -> None:
    """An sglang startup makes several alloc calls: the line is replayed as the one it names."""
    el = parse_error_line(line(1 << 30, 0))
    with pytest.raises(ValueError, match="raw alloc it names"):
        Request(sglang={"layers": 32}, error_line=el)


@pytest.mark.parametrize("backing", ["Anonymous", "AnonymousShm"])
def test_a_backing_without_hugepages_is_said_as_one_mmap(backing: str) -> None:
    """No hugetlb mmap, no fallback: the causes say the one mapping the request makes."""
    text = line(100000595968, node=1, backing=backing)
    _, found = line_hosts(request_for(text))
    causes = " ".join(h.cause for h in found.hypotheses)
    assert found.hypotheses and "rlimit_as" in [h.kind for h in found.hypotheses]
    assert "its one mmap fails with ENOMEM" in causes
    assert "hugetlb" not in causes and "fallback" not in causes


def test_a_hugetlb_line_says_both_mmaps() -> None:
    _, found = line_hosts(request_for(line(100000595968, node=1)))
    rlimit = next(h for h in found.hypotheses if h.kind == "rlimit_as")
    assert "the hugetlb mmap and the 4 KiB-page fallback both fail with ENOMEM" in rlimit.cause


def test_a_moment_is_combined_only_when_it_causes_the_fallback() -> None:
    """A host with no pool demotes the request as dumped: a memory cgroup limit demoting it too
    is no cause, so it is not tried again under overcommit_memory 2 (no "memcg+..." kind)."""
    machine = Machine.x86_64(nodes=2, mem_per_node="32GiB")
    request = request_for(line(4096))
    d = diagnose(machine, None, request)
    assert d.run.outcome == "demoted" and d.hypotheses is not None
    kinds = [h.kind for h in d.hypotheses.hypotheses]
    assert kinds and not any("+" in k for k in kinds), kinds
    memcg = next(t for t in d.hypotheses.ruled_out if t.change.startswith("a memory cgroup"))
    assert memcg.change.endswith(", one page")
    # With a pool that has room, taking its pages is what demotes: then both are tried.
    pooled = Machine.x86_64(nodes=2, mem_per_node="32GiB", hugepages={"2MiB": 4})
    d = diagnose(pooled, None, request_for(line(4 << 20)))
    assert d.run.outcome == "ok" and d.hypotheses is not None
    kinds = [h.kind for h in d.hypotheses.hypotheses]
    assert "hugepages_taken+overcommit_mode" in kinds, kinds


def test_a_request_of_less_than_a_page_still_finds_its_rlimit_edge() -> None:
    text = line(100, backing="Anonymous")
    machine, found = line_hosts(request_for(text))
    rlimit = next(h for h in found.hypotheses if h.kind == "rlimit_as")
    assert rlimit.verified.fields == {"rlimit_as": 3072}  # the 4 KiB mmap: 3 KiB still fails
    assert rerun(machine, request_for(text), {"rlimit_as": 4096}) != text


def test_files_left_in_a_hugetlbfs_mount_are_a_moment_of_the_search(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # two nodes of 4096 free 2 MiB pages: the line needs the pool short and a strict commit
    host = tmp_path / "host.txt"
    host.write_text(
        "Node 0 HugePages_Total: 4096\nNode 0 HugePages_Free: 4096\n"
        "Node 1 HugePages_Total: 4096\nNode 1 HugePages_Free: 4096\n$ uname -r\n6.8.0\n"
    )
    doc = replay_json(capsys, host, "--error", line(4 << 30))
    by = {h["kind"]: h for h in doc["hypotheses"]["hypotheses"]}
    files = by["hugetlbfs_files+overcommit_mode"]
    assert files["cause"].startswith(
        "files left in a hugetlbfs mount (e.g. /dev/hugepages, DPDK's rte map files) held 6145 "
        "of the 8192 free 2 MiB hugepages, leaving 2047 of the 2048 needed (so the allocator "
        "falls back to 4 KiB pages), and vm.overcommit_memory was 2"
    )
    assert files["verified"]["reproduces_error_line"] is True
    assert files["collect"][-1].startswith("grep hugetlbfs /proc/mounts, then ls -la each mount")
    # the pages are in use (free below total), not reserved
    pools = [n["hugepages"][str(2 << 20)] for n in files["verified"]["machine"]["nodes"]]
    assert sum(p["free"] for p in pools) == 2047 and sum(p["total"] for p in pools) == 8192
