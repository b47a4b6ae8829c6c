"""replay --symptom: what the server showed (SIGBUS, an OOM kill, the demotion) as the question
(umbp_sim/diagnose/symptom.py); a host as dumped that does not give it is searched for the
hidden causes that do, each verified by its own run (umbp_sim/diagnose/symptom_causes.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from umbp_sim.cli import main
from umbp_sim.diagnose.replay_request import Request
from umbp_sim.diagnose.simulate import simulate_request
from umbp_sim.diagnose.symptom import Symptom, SymptomError, parse_symptom
from umbp_sim.machine import Machine
from umbp_sim.request import AllocRequest

GiB, MiB = 1 << 30, 1 << 20
REPLAY = Path(__file__).parent / "data" / "replay"
# Two nodes of 4096 free 2 MiB pages each, kernel 6.8: a 4 GiB buffer fits anywhere.
PASTE = """$ grep -r . /sys/devices/system/node/node*/meminfo | grep -i huge
/sys/devices/system/node/node0/meminfo:Node 0 HugePages_Total:  4096
/sys/devices/system/node/node0/meminfo:Node 0 HugePages_Free:   4096
/sys/devices/system/node/node1/meminfo:Node 1 HugePages_Total:  4096
/sys/devices/system/node/node1/meminfo:Node 1 HugePages_Free:   4096
$ uname -r
6.8.0-45-generic
"""
SGLANG_WARNING = (
    "[2026-03-01 10:00:00] WARNING umbp_host_allocator.py:210: UMBPHostTensorAllocator: "
    "requested UMBPHostBufferBacking.AnonymousHugetlb backing but kernel demoted to "
    "UMBPHostBufferBacking.Anonymous (4 KiB pages). Check vm.nr_hugepages and HugePages_Free "
    "in /proc/meminfo. Performance and AINIC MR-size benefits will not apply."
)
MORI_WARNING = (
    "HostMemAllocator: MAP_HUGETLB allocation failed for size=4294967296 hugepage_size=2097152 "
    "(12: Cannot allocate memory); falling back to anonymous pages. HugePages_Total:       0 "
    "HugePages_Free:        0 Hugepagesize:       2048 kB"
)


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("SIGBUS", "sigbus"),
        ("bus-error", "sigbus"),
        ("Bus error (core dumped)", "sigbus"),
        ("Fatal Python error: Bus error", "sigbus"),
        ("oom-kill", "oom-kill"),
        ("OOMKilled", "oom-kill"),
        ("Killed", "oom-kill"),
        ("./start.sh: line 4: 1234 Killed   python -m sglang.launch_server", "oom-kill"),
        ("[812.1] Out of memory: Killed process 1234 (python3) total-vm:123kB", "oom-kill"),
        ("Memory cgroup out of memory: Killed process 1234 (python3)", "oom-kill"),
        ("demoted", "demoted"),
        (SGLANG_WARNING, "demoted"),
        (MORI_WARNING, "demoted"),
        ("hugetlb mmap of 4294967296 bytes (2048 kB pages) failed: ENOMEM; HugePages of 2048 "
         "kB: free 0, total 0, reserved 0; falling back to 4 KiB pages (Anonymous)", "demoted"),
    ],
)  # fmt: skip
def test_each_accepted_form_is_classified(text: str, kind: str) -> None:
    assert parse_symptom(text) == Symptom(kind, text.strip())


@pytest.mark.parametrize("text", ["segfault", "Segmentation fault (core dumped)", ""])
def test_an_unknown_text_is_one_usage_line_listing_the_forms(text: str) -> None:
    with pytest.raises(SymptomError) as e:
        parse_symptom(text)
    assert str(e.value) == (
        f"--symptom {text!r}: not a symptom umbp-sim reads; give SIGBUS (or 'Bus error'), "
        "oom-kill (or 'Killed', the kernel's 'Out of memory: Killed process' line), demoted (or "
        "sglang's 'requested ... backing but kernel demoted to ...' line, mori's 'MAP_HUGETLB "
        "allocation failed ... falling back' line)"
    )
    assert e.value.exit_code == 64


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["--size", "4GiB", "--symptom", "segfault"],
         "--symptom 'segfault': not a symptom umbp-sim reads; give SIGBUS"),
        (["--symptom", "SIGBUS", "--error", "RuntimeError: UMBPHostMemAllocator.alloc(1073741824 "
          "bytes) failed (requested_backing=AnonymousHugetlb, numa_node=0)"],
         "--symptom cannot be combined with --error: the error line is a failed alloc (a null "
         "handle), the symptom what the server showed instead; give the one it showed"),
        (["--symptom", "SIGBUS"], "no request: give --size"),
    ],
)  # fmt: skip
def test_bad_symptom_flags_are_one_line_exit_64(capsys, tmp_path, argv, text) -> None:  # type: ignore[no-untyped-def]
    host = tmp_path / "host.txt"
    host.write_text(PASTE)
    code, out, err = _run(capsys, ["replay", str(host), *argv])
    assert code == 64 and out == ""
    assert err.startswith("umbp-sim replay: ") or text in err
    assert text in err and err.count("\n") == 1


def test_no_dump_with_a_symptom_is_one_line(capsys) -> None:  # type: ignore[no-untyped-def]
    code, out, err = _run(capsys, ["replay", "--size", "4GiB", "--symptom", "SIGBUS"])
    assert (code, out) == (64, "")
    assert err == (
        "umbp-sim replay: DUMP: --symptom is asked of a host: give its dump (umbp-sim collect) "
        "or what was pasted of it (docs/pastes.md)\n"
    )


def _replay(capsys, tmp_path, *argv: str) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    host = tmp_path / "host.txt"
    host.write_text(PASTE)
    code, out, _ = _run(capsys, ["replay", str(host), *argv, "--json"])
    assert code == 0
    return json.loads(out)  # type: ignore[no-any-return]


def _machine(doc: dict[str, Any], fields: dict[str, Any], base: Machine) -> Machine:
    """``base`` changed by a hypothesis's JSON fields (sizes keyed by strings in JSON)."""
    from dataclasses import replace

    from umbp_sim.host.host_nodes import HugePool, Node

    out: dict[str, Any] = {}
    for k, v in fields.items():
        if k == "nodes":
            out[k] = [Node(**{**n, "hugepages": {int(s): HugePool(**p) for s, p in
                                                 n["hugepages"].items()}}) for n in v]  # fmt: skip
        elif isinstance(v, dict):
            out[k] = {int(s): x for s, x in v.items()}
        else:
            out[k] = v
    return replace(base, **out)


def test_sigbus_on_a_fine_host_searches_the_hidden_causes(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    doc = _replay(capsys, tmp_path, "--size", "4GiB", "--numa-node", "1", "--symptom",
                  "Bus error (core dumped)")  # fmt: skip
    assert doc["outcome"] == "ok"  # the host as dumped is fine: the search runs instead
    assert doc["symptom"] == {"kind": "sigbus", "given": "Bus error (core dumped)",
                              "means": "the process died of SIGBUS (Bus error)",
                              "reproduced": False}  # fmt: skip
    found = doc["hypotheses"]
    assert found["question"] == "SIGBUS"
    kinds = [h["kind"] for h in found["hypotheses"]]
    assert kinds == ["hugetlb_cgroup", "node_pool", "hugetlbfs_files"]
    by = {h["kind"]: h for h in found["hypotheses"]}
    # each at its edge: the run there dies of SIGBUS, the run just past it does not
    for h in found["hypotheses"]:
        assert h["verified"]["reproduces_symptom"] is True
        assert h["verified"]["simulated"].startswith("crashed: killed by SIGBUS")
        assert h["beyond"]["reproduces_symptom"] is False
        assert h["beyond"]["simulated"] == "ok: AnonymousHugetlb on node 1"
        assert h["collect"] and h["fix"]
    assert by["hugetlb_cgroup"]["verified"]["machine"]["hugetlb_cgroup_max"] == {
        str(2 * MiB): 4 * GiB - 2 * MiB
    }
    assert by["hugetlb_cgroup"]["fix"] == [
        "echo max > /sys/fs/cgroup/<server cgroup>/hugetlb.2MB.max",
        "a pod: resources.limits.hugepages-2Mi: 4096Mi in its spec",
    ]
    files = by["hugetlbfs_files"]
    assert files["verified"]["change"] == (
        "files in a hugetlbfs mount holding 2049 2 MiB pages on node 1"
    )
    assert files["fix"] == [
        "remove the files: rm /dev/hugepages/rtemap_* (those no running process uses); or reboot"
    ]
    # the held pages are in use on node 1 (free below total), not reserved
    node1 = files["verified"]["machine"]["nodes"][1]["hugepages"][str(2 * MiB)]
    assert (node1["total"], node1["free"]) == (4096, 2047)
    # what does not give SIGBUS is kept with what it gives
    ruled = {t["change"]: t["simulated"] for t in found["ruled_out"]}
    assert ruled["memory.max 4.00 GiB (4,294,963,200 bytes)"] == "ok: AnonymousHugetlb on node 1"


def test_a_hypothesis_is_verified_independently(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    doc = _replay(capsys, tmp_path, "--size", "4GiB", "--numa-node", "1", "--symptom", "SIGBUS")
    from umbp_sim.dump import load_machine

    host = tmp_path / "host.txt"
    base = load_machine(str(host))
    request = Request(AllocRequest(4 * GiB, "AnonymousHugetlb", 2 * MiB, 1, True))
    for h in doc["hypotheses"]["hypotheses"]:
        run = simulate_request(_machine(doc, h["verified"]["machine"], base), request)
        assert (run.outcome, run.observed.signal) == ("crashed", "SIGBUS"), h["kind"]


def test_oom_kill_of_a_hugepage_request_needs_the_demotion_first(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    doc = _replay(capsys, tmp_path, "--size", "4GiB", "--symptom", "Killed")
    found = doc["hypotheses"]
    assert [h["kind"] for h in found["hypotheses"]] == [
        "hugetlbfs_files+memcg",
        "hugetlbfs_files+host_memory",
    ]
    first = found["hypotheses"][0]
    assert first["verified"]["simulated"].startswith("crashed: killed by SIGKILL")
    assert first["beyond"]["simulated"] == "demoted: Anonymous (4 KiB pages)"
    # alone, the memory cgroup limit does not touch a hugepage buffer
    ruled = {t["change"]: t["simulated"] for t in found["ruled_out"]}
    assert ruled["memory.max 4.00 GiB (4,294,963,200 bytes)"] == "ok: AnonymousHugetlb"


def test_the_demotion_warning_pasted(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    doc = _replay(capsys, tmp_path, "--size", "4GiB", "--symptom", MORI_WARNING)
    assert doc["symptom"]["kind"] == "demoted" and doc["symptom"]["reproduced"] is False
    kinds = [h["kind"] for h in doc["hypotheses"]["hypotheses"]]
    assert kinds == ["hugetlbfs_files", "hugetlb_rsvd_cgroup", "hugepages_taken"]


POD = """    Limits:
      cpu:     16
      memory:  200Gi
    Requests:
      cpu:     16
"""


def test_a_reproduced_symptom_is_explained_and_the_pod_fixed_in_its_spec(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # a pod whose limits name no hugepages-2Mi: Kubernetes' hugetlb limit 0, a SIGBUS
    host = tmp_path / "pod.txt"
    host.write_text(PASTE + "$ kubectl describe pod sglang-0\n" + POD)
    code, out, _ = _run(capsys, ["replay", str(host), "--size", "4GiB", "--symptom", "SIGBUS",
                                 "--json"])  # fmt: skip
    doc = json.loads(out)
    assert code == 0
    assert (doc["outcome"], doc["signal"]) == ("crashed", "SIGBUS")
    assert doc["symptom"]["reproduced"] is True
    assert doc["hypotheses"] is None  # explained as usual: no search
    first = doc["fixes"][0]
    assert first["action"] == "give the pod a hugepages limit its buffers fit (2048 kB pages)"
    assert first["commands"] == [
        "resources.limits.hugepages-2Mi: 4096Mi (the pod spec, requests the same)"
    ]
    assert first["outcome_after"] == "ok: AnonymousHugetlb"
    assert not any("hugetlb.2MB.max" in c for f in doc["fixes"] for c in f["commands"])


def test_a_pod_s_limit_as_a_hypothesis_is_fixed_in_its_spec(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    host = tmp_path / "pod.txt"
    host.write_text(PASTE + "$ kubectl describe pod sglang-0\n" + POD.replace(
        "memory:  200Gi", "memory:  200Gi\n      hugepages-2Mi: 8Gi"))  # fmt: skip
    code, out, _ = _run(capsys, ["replay", str(host), "--size", "4GiB", "--numa-node", "1",
                                 "--symptom", "SIGBUS", "--json"])  # fmt: skip
    doc = json.loads(out)
    assert code == 0 and doc["outcome"] == "ok"
    by = {h["kind"]: h for h in doc["hypotheses"]["hypotheses"]}
    assert by["hugetlb_cgroup"]["fix"] == ["resources.limits.hugepages-2Mi: 4096Mi in the pod spec"]


def test_text_report_names_the_symptom(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    host = tmp_path / "host.txt"
    host.write_text(PASTE)
    code, out, _ = _run(capsys, ["replay", str(host), "--size", "4GiB", "--numa-node", "1",
                                 "--symptom", "SIGBUS"])  # fmt: skip
    assert code == 0
    assert "   the symptom given: the process died of SIGBUS (Bus error): NOT reproduced" in out
    assert "   the host as dumped does not give SIGBUS; changed in what a dump cannot show (" in out
    assert "      to fix: remove the files: rm /dev/hugepages/rtemap_*" in out
    assert "   does not give SIGBUS (simulated):" in out
    assert (
        "   nothing on the host as dumped: the request gets what it asks for on it; what to "
        "change is each hypothesis's above, once collecting confirms it"
    ) in out


def test_the_html_page_carries_the_search(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    host = tmp_path / "host.txt"
    host.write_text(PASTE)
    page = tmp_path / "page.html"
    code, _, _ = _run(capsys, ["replay", str(host), "--size", "4GiB", "--numa-node", "1",
                               "--symptom", "SIGBUS", "--html", str(page)])  # fmt: skip
    assert code == 0
    html = page.read_text()
    assert "the symptom given: the process died of SIGBUS (Bus error): NOT reproduced" in html
    assert "<h3>does not give SIGBUS (simulated)</h3>" in html
    assert "to fix: remove the files: rm /dev/hugepages/rtemap_*" in html


def test_a_fleet_says_which_hosts_give_the_symptom(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    fine, pod = tmp_path / "fine.txt", tmp_path / "pod.txt"
    fine.write_text(PASTE)
    pod.write_text(PASTE + "$ kubectl describe pod sglang-0\n" + POD)
    code, out, _ = _run(capsys, ["replay", str(fine), str(pod), "--size", "4GiB", "--symptom",
                                 "SIGBUS", "--json"])  # fmt: skip
    rows = {r["dump"].rsplit("/", 1)[-1]: r for r in json.loads(out)["hosts"]}
    assert code == 2  # the worst host crashed
    assert (rows["fine.txt"]["reproduces_symptom"], rows["fine.txt"]["hypotheses"]) == (
        False, ["hugetlb_cgroup"])  # fmt: skip
    assert rows["pod.txt"]["reproduces_symptom"] is True
    assert rows["pod.txt"]["reproduces_error_line"] is None
    page = tmp_path / "fleet.html"
    _run(capsys, ["replay", str(fine), str(pod), "--size", "4GiB", "--symptom", "SIGBUS",
                  "--html", str(page)])  # fmt: skip
    assert "<th>symptom</th>" in page.read_text()


def test_oom_kill_bound_to_a_node_combines_with_the_pool_short(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # bound to node 1, files there give SIGBUS, not the demotion: others' reservations (the
    # pool short) come before the reservation limit as what sent the buffer to base pages
    doc = _replay(capsys, tmp_path, "--size", "4GiB", "--numa-node", "1", "--symptom", "oom-kill")
    kinds = [h["kind"] for h in doc["hypotheses"]["hypotheses"]]
    assert kinds == ["hugepages_taken+memcg", "hugepages_taken+host_memory"]
