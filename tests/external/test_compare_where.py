"""compare says where: a class's first differing run shows the two syscall traces from the first
call that differs, that call's source line in each build (the interposer's call site, read from
the build's debug info), and the call that made each fd or mapping a run left held; a build
without debug info says so. One small matrix: the two runs of a ShmHugetlb request on a host
without a hugetlb pool (the memfd's mmap fails: the planted leak's failure path)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from umbp_sim.cli import main
from umbp_sim.comparison import call_sites
from umbp_sim.comparison.divergence import divergence, located, where_lines
from umbp_sim.engine.record import RunRecord
from umbp_sim.toolchain.wrapped_build import compile_command

TINY_SOURCE = Path(__file__).resolve().parent / "tiny_allocator.cpp"
PICK = [
    "--no-scenarios",
    "-j",
    "1",
    "-k",
    "[[]no-pool k6.8.0] alloc(size=4096, AnonymousShmHugetlb*",
]


def _line_of(text: str) -> int:
    """The line of the test allocator's source holding ``text`` (once)."""
    lines = [i for i, line in enumerate(TINY_SOURCE.read_text().splitlines(), 1) if text in line]
    assert len(lines) == 1, lines
    return lines[0]


def test_a_leaked_fd_names_the_call_that_made_it_and_its_source_line(
    tiny_builds: dict[str, str],
    tiny_planted: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    # A: the test allocator built without -g (preloaded); B: the planted leak, built by
    # build-allocator's command (with -g), which leaves the memfd open when its mmap fails.
    plain, leaky = tiny_builds["preload"], tiny_planted["leak_fd"]
    assert main(["compare", plain, leaky, *PICK, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    items = doc["differences"]["leak"]
    assert [(i["a"], i["b"]) for i in items] == [({"mappings": 0, "fds": 0},
                                                 {"mappings": 0, "fds": 1})] * 2  # fmt: skip
    assert "where" not in items[1]  # a class's first run says where
    where = items[0]["where"]
    # memfd_create, ftruncate, the mmap that fails; then A closes the fd, B does not (what B
    # does instead depends on the C++ library: under ASan its meminfo read is not routed).
    assert where["call"] == 4 and where["same_calls"] == 3
    assert where["a"][0] == "close(1000000) = 0"
    assert where["b"] and not any(c.startswith("close(1000000)") for c in where["b"])
    assert where["site_a"] == {
        "object": plain,
        "offset": where["site_a"]["offset"],
        "note": f"no debug info in {plain}: build with -g",
    }
    if where["b"][0].startswith('read_file("/proc/meminfo")'):
        assert where["site_b"] is None  # not a call of the seam: no site
    else:  # under ASan the read is not routed: B's next call is its fallback's memfd_create
        assert where["b"][0].startswith("memfd_create(")
        assert Path(where["site_b"]["file"]).resolve() == TINY_SOURCE
    [leak] = where["leaks_b"]
    assert leak["what"] == "fd 1000000" and leak["call_number"] == 1
    assert leak["call"].startswith('memfd_create("tiny", MFD_CLOEXEC|MFD_HUGETLB')
    site = leak["site"]
    assert Path(site["file"]).resolve() == TINY_SOURCE
    assert site["line"] == _line_of('fd = memfd_create("tiny", flags);')
    assert "alloc" in site["function"] and site["object"] == leaky
    assert "leaks_a" not in where

    # The report, --html and --junit say the same.
    page, junit = tmp_path / "c.html", tmp_path / "c.xml"
    argv = ["compare", plain, leaky, *PICK, "--html", str(page), "--junit", str(junit)]
    assert main(argv) == 1
    out = capsys.readouterr().out
    at = f"{site['file']}:{site['line']} ({site['function']})"
    expected = [
        "    where the traces part: call #4 (3 calls alike before it)",
        "      A #4: close(1000000) = 0",
        f"            at no debug info in {plain}: build with -g",
        f"      B #4: {where['b'][0]}",
        *(
            [f"            at {sb['file']}:{sb['line']} ({sb['function']})"]
            if (sb := where["site_b"])
            else []
        ),
        f"      A #5: {where['a'][1]}",
    ]
    lines = out.splitlines()
    start = lines.index(expected[0])
    assert lines[start : start + len(expected)] == expected
    assert f"    B left fd 1000000: made by call #1 {leak['call']}" in lines
    assert f"            at {at}" in lines
    html = page.read_text()
    assert html.count('class="where"') == 1 and f"{Path(site['file']).name}:{site['line']}" in html
    failure = ET.parse(junit).getroot().find(".//testcase[@name='leak']/failure")
    assert failure is not None and f"at {at}" in (failure.text or "")


def test_build_allocator_builds_with_debug_info(capsys: pytest.CaptureFixture[str]) -> None:
    """-g by default (compare's source lines need it); --link-arg -g0 after it turns it off."""
    assert "-g" in compile_command(["a.cpp"], "a.so")
    assert main(["build-allocator", "a.cpp", "-o", "a.so", "--print-command"]) == 0
    printed = capsys.readouterr().out.split()
    assert "-g" in printed and "-O2" in printed


def _record(trace: list[str], dropped: int = 0) -> RunRecord:
    return RunRecord("ok", trace=trace, trace_dropped=dropped)


def test_calls_that_differ_only_in_addresses_are_alike() -> None:
    a = _record(["mmap(NULL, 4096, ...) = 0x7f0000001000", "munmap(0x7f0000001000, 4096) = 0"])
    b = _record(["mmap(NULL, 4096, ...) = 0x7f0000abc000", "munmap(0x7f0000abc000, 4096) = 0"])
    where = divergence(a, b)
    assert where is not None and where["call"] is None and where["same_calls"] == 2
    assert where_lines(where) == ["the two runs made the same 2 calls"]
    assert divergence(_record([]), _record([])) is None


def test_traces_cut_short_are_compared_call_by_call_number() -> None:
    """A trace whose first calls were dropped (the TracingKernel keeps the last 100,000) is
    matched to the other by call number, not by place in the list."""
    a = _record([f"close({i}) = 0" for i in range(10)])
    b = _record([f"close({i}) = 0" for i in range(4, 7)] + ["close(99) = 0"], dropped=4)
    where = divergence(a, b)
    assert where is not None
    assert (where["call"], where["same_calls"]) == (8, 3)
    assert where["a"][0] == "close(7) = 0" and where["b"] == ["close(99) = 0"]
    assert where["site_a"] is None and where["site_b"] is None  # built-in: no call sites


def test_a_site_in_an_object_that_is_gone_says_so(tmp_path: Path) -> None:
    gone = str(tmp_path / "gone.so")
    a = _record(["close(3) = 0"])
    a.trace_sites, a.call_sites = [0], [(gone, 0x1234)]
    where = located(divergence(a, _record(["close(4) = 0"])) or {})
    assert where["site_a"] == {
        "object": gone,
        "offset": 0x1234,
        "note": f"{gone}: no such file here (the build moved?)",
    }


def test_a_run_that_died_names_its_calls_lines_from_its_evidence(
    tiny_builds: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The test allocator touches by hand after MADV_POPULATE_WRITE's EFAULT and dies of
    SIGBUS; umbp-sim demotes. The dead run's trace and its call sites come from the
    interposer's evidence; the built-in allocator's calls have no site."""
    run = "[[]pool-on-node0 k6.8.0] alloc(size=4194304, AnonymousHugetlb, hugepage_size=2097152, "
    argv = ["compare", "umbp-sim", tiny_builds["wrap"], "--no-scenarios", "-j", "1", "--json"]
    assert main([*argv, "-k", run + "numa_node=1, prefault=True)"]) == 1
    [item] = json.loads(capsys.readouterr().out)["differences"]["outcome"]
    assert (item["a"], item["b"]) == ("ok Anonymous", "crash SIGBUS in alloc")
    where = item["where"]
    assert where["b"][0].startswith("mbind(") and where["b"][-1].startswith("touch(")
    assert "killed by SIGBUS" in where["b"][-1]
    assert where["site_a"] is None
    site = where["site_b"]
    assert Path(site["file"]).resolve() == TINY_SOURCE and site["object"] == tiny_builds["wrap"]
    assert site["line"] == _line_of("long rc = syscall(SYS_mbind")


def test_a_machine_without_addr2line_says_so_in_one_line(
    tiny_planted: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(call_sites.shutil, "which", lambda _name: None)
    monkeypatch.setattr(call_sites, "_cache", {})
    [loc] = call_sites.locate([(tiny_planted["leak_fd"], 0x10)]).values()
    assert loc["note"] == "addr2line not found (install binutils): no source lines"
