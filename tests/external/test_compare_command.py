"""umbp-sim compare / build-allocator / --allocator SPEC parsing: exit codes, reports, JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import MORI_SURFACE

from umbp_sim.allocator_spec import AllocatorSpec, AllocatorSpecError, parse_allocator_spec
from umbp_sim.cli import main
from umbp_sim.comparison import matrix


def test_builtin_against_itself_finds_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "umbp-sim", "umbp-sim"]) == 0
    out = capsys.readouterr()
    runs = len({r.label for r in [*matrix.quick(), *matrix.scenario_runs()]})
    assert out.out == f"compared umbp-sim (A) with umbp-sim (B) over {runs} runs\nno differences\n"
    assert out.err == ""  # no progress bar when stderr is not a terminal


def test_the_test_allocator_differs_where_it_was_made_to(
    tiny_builds: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["compare", "umbp-sim", tiny_builds["wrap"], "--no-scenarios", "--json"]
    assert main([*argv, "-k", "*pool-on-node0 k6.8.0*"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["a"] == "umbp-sim" and doc["b"] == tiny_builds["wrap"]
    assert not doc["same"] and doc["differing_runs"] > 0
    diffs = doc["differences"]
    by_run = {c: {d["run"]: (d["a"], d["b"]) for d in items} for c, items in diffs.items()}
    # umbp-sim demotes a hugetlb buffer whose populate hits EFAULT; the test allocator touches
    # the pages by hand and dies of SIGBUS inside alloc (as mori does in the field).
    key = "[pool-on-node0 k6.8.0] alloc(size=4194304, AnonymousHugetlb, hugepage_size=2097152, "
    assert by_run["outcome"][key + "numa_node=1, prefault=True)"] == (
        "ok Anonymous", "crash SIGBUS in alloc",
    )  # fmt: skip
    # hugepage_size=1: a default-size hugetlb buffer there (whose munmap of 3 MiB then fails:
    # a leak), a demotion here.
    one = key.replace("4194304", "3145728").replace("2097152", "1") + "numa_node=-1, prefault=True)"
    assert by_run["backing"][one] == ("Anonymous", "AnonymousHugetlb")
    assert by_run["alignment"][one] == (4096, 1)
    assert by_run["leak"][one] == ({"mappings": 0, "fds": 0}, {"mappings": 1, "fds": 0})
    # ... whose pages come from node 0's 2 MiB pool: that follows from the backing; with the same
    # policy ("default") it is no binding difference of its own.
    assert one not in by_run.get("numa binding", {})
    # node 63: its bit is beyond maxnode-1 in the test allocator's mask.
    n63 = key.replace("AnonymousHugetlb", "Anonymous") + "numa_node=63, prefault=True)"
    a, b = by_run["warning text"][n63]
    assert b == ["mbind(node=63) failed: Invalid argument"]
    assert set(diffs) <= {
        "outcome", "backing", "mapped_size", "alignment", "numa binding", "crash", "leak",
        "warning count", "warning text",
    }  # fmt: skip


def test_report_groups_by_class(
    tiny_builds: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["compare", tiny_builds["preload"], "umbp-sim", "--no-scenarios", "--examples", "1"]
    assert main([*argv, "-k", "*ample k6.8.0*numa_node=63*"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"compared {tiny_builds['preload']} (A) with umbp-sim (B) over 4 runs"
    assert out[1] == "4 runs differ"
    assert "warning text: 4 runs" in out
    assert "  ... 3 more (--json for all)" in out


def test_an_allocator_that_cannot_run_is_exit_2(
    capi_probe: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", "umbp-sim", capi_probe, "--matrix", "none"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"umbp-sim compare: {capi_probe}: ImportError: {capi_probe}: not a ")


def test_bad_spec_is_one_usage_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "umbp-sim", str(tmp_path / "nope.so")]) == 64
    assert capsys.readouterr().err == (
        f"umbp-sim compare: SPEC_B '{tmp_path / 'nope.so'}': no such file\n"
    )
    text = tmp_path / "x.so"
    text.write_text("not elf")
    assert main(["compare", str(text), "umbp-sim"]) == 64
    assert "SPEC_A" in (err := capsys.readouterr().err) and "not a shared object (ELF)" in err


def test_a_pattern_that_matches_no_run_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """A regression check that compared nothing must not pass."""
    assert main(["compare", "umbp-sim", "mori", "-k", "nomatch*"]) == 64
    assert capsys.readouterr().err == (
        "umbp-sim compare: -k 'nomatch*': no run's label matches (nothing compared)\n"
    )
    assert main(["compare", "umbp-sim", "mori", "--matrix", "none", "--no-scenarios"]) == 64
    assert capsys.readouterr().err == "umbp-sim compare: no runs (nothing compared)\n"


def test_an_allocator_that_cannot_run_leaves_no_page(
    capi_probe: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "compare.html"
    assert main(["compare", "umbp-sim", capi_probe, "--matrix", "none", "--html", str(page)]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 1
    assert not page.exists()


def test_build_allocator_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build-allocator", str(tmp_path / "a.cpp"), "-o", str(tmp_path / "a.so")]) == 65
    assert (
        capsys.readouterr().err
        == f"umbp-sim build-allocator: {tmp_path / 'a.cpp'}: no such source file\n"
    )
    src = tmp_path / "bad.cpp"
    src.write_text("this is not C++\n")
    assert main(["build-allocator", str(src), "-o", str(tmp_path / "bad.so")]) == 65
    err = capsys.readouterr().err
    assert err.startswith(f"umbp-sim build-allocator: compiling {tmp_path / 'bad.so'} failed:\n")
    assert "-Wl,--wrap=mmap" in err and "error" in err


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("umbp-sim", AllocatorSpec("builtin", "umbp-sim")),
        ("mori-624002c", AllocatorSpec("builtin", "mori-624002c")),
        ("mori", AllocatorSpec("builtin", "mori-624002c")),
        ("mori.umbp", AllocatorSpec("module", "mori.umbp")),
    ],
)
def test_parse_allocator_spec(text: str, spec: AllocatorSpec) -> None:
    assert parse_allocator_spec(text) == spec


def test_parse_allocator_spec_paths_and_errors(tiny_builds: dict[str, str]) -> None:
    s = parse_allocator_spec(tiny_builds["preload"])
    assert (s.kind, s.path) == ("shared-object", tiny_builds["preload"])
    with pytest.raises(AllocatorSpecError, match=r"^--allocator 'not a spec!': not a built-in"):
        parse_allocator_spec("not a spec!")
    assert AllocatorSpecError("x").exit_code == 64


PY_ALLOCATOR = (
    "import ctypes, enum, mmap\n"
    + MORI_SURFACE
    + """

class UMBPHostMemAllocator:
    def alloc(self, size, backing, hugepage_size=0, numa_node=-1, prefault=True):
        return Handle(mmap.mmap(-1, max(4096, (min(size, 1 << 20) + 4095) // 4096 * 4096)), size)

    def free(self, h):
        pass
"""
)


def test_a_module_spec_resolves_as_python_m_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """issue 41: a Python allocator module in the working directory (``mod``) is found there
    first, as ``python -m mod`` finds it; a path to its file (``./mod.py``) is the module
    imported from the file's directory; a file whose name is no module name is refused in one
    line saying how to name it."""
    (tmp_path / "mod.py").write_text(PY_ALLOCATOR)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "my-alloc.py").write_text(PY_ALLOCATOR)
    monkeypatch.chdir(tmp_path)
    assert parse_allocator_spec("mod") == AllocatorSpec("module", "mod", directory=str(tmp_path))
    spec = parse_allocator_spec("./mod.py")
    assert (spec, spec.import_name) == (
        AllocatorSpec("module", "./mod.py", directory=str(tmp_path)),
        "mod",
    )
    pick = ["--no-scenarios", "-k", "*] alloc(size=4096, Anonymous, *", "-j", "1", "--json"]
    assert main(["compare", "mod", "./mod.py", *pick]) == 0, capsys.readouterr().err
    doc = json.loads(capsys.readouterr().out)
    assert (doc["a"], doc["b"], doc["runs"] > 0) == ("mod", "./mod.py", True)
    argv = ["preflight", "--size", "8KiB", "--backing", "anonymous", "--json", "--allocator"]
    assert main([*argv, "mod"]) == 0
    assert json.loads(capsys.readouterr().out)["outcome"] == "ok"
    assert main(["compare", "mod", "sub/my-alloc.py", *pick]) == 64
    assert capsys.readouterr().err == (
        "umbp-sim compare: SPEC_B 'sub/my-alloc.py': 'my-alloc' is not a Python module name "
        "(rename the file like my_alloc.py)\n"
    )


ZERO = "[ample k6.8.0] alloc(size=0, Anonymous, hugepage_size=2097152, numa_node=-1, prefault=True)"


def test_a_warning_count_difference_shows_the_texts(capsys: pytest.CaptureFixture[str]) -> None:
    """issue 27: the class printed the two counts only; now the texts of both sides too."""
    argv = ["compare", "umbp-sim", "mori-624002c", "--no-scenarios", "-k", "[[]" + ZERO[1:]]
    assert main([*argv, "--json"]) == 1
    (item,) = json.loads(capsys.readouterr().out)["differences"]["warning count"]
    said = ["Alloc(size=0): nothing to allocate; returning an invalid handle"]
    assert item == {"run": ZERO, "a": 1, "b": 0, "texts_a": said, "texts_b": []}
    assert main(argv) == 1
    out = capsys.readouterr().out.splitlines()
    at = out.index(f"  {ZERO}")
    assert out[at + 1 : at + 4] == ["    A: 1", f"       {said[0]}", "    B: 0"]


def test_junit_has_a_case_per_class_failing_with_its_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import xml.etree.ElementTree as ET

    from umbp_sim.comparison.differences import CLASSES

    out = tmp_path / "compare.xml"
    argv = ["compare", "umbp-sim", "mori-624002c", "--no-scenarios", "-k", "*ample k6.8.0*"]
    assert main([*argv, "--json", "--junit", str(out)]) == 1  # 136 runs, 68 differ
    doc = json.loads(capsys.readouterr().out)
    suite = ET.parse(out).getroot().find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == list(CLASSES)
    failed = {c.get("name"): c.find("failure") for c in cases if c.find("failure") is not None}
    assert set(failed) == set(doc["differences"]) and suite.get("failures") == str(len(failed))
    for cls, failure in failed.items():
        n = len(doc["differences"][cls])
        assert failure.get("message") == f"{n} of {doc['runs']} runs differ in {cls}"
        assert all(d["run"] in (failure.text or "") for d in doc["differences"][cls])
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props == {"runs": str(doc["runs"]), "differing_runs": str(doc["differing_runs"])}
    # the same allocator twice: every case passes
    assert main(["compare", "umbp-sim", "umbp-sim", "--no-scenarios", "--junit", str(out)]) == 0
    assert ET.parse(out).getroot().find("testsuite").get("failures") == "0"  # type: ignore[union-attr]


def test_an_unwritable_junit_file_fails_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "missing-dir" / "c.xml"
    assert main(["compare", "umbp-sim", "umbp-sim", "--junit", str(target)]) == 73
    err = capsys.readouterr().err
    assert f"--junit {target}: cannot write: No such file or directory" in err
    assert not target.parent.exists()


def test_a_touch_stride_bug_differs_in_faulted_pages(
    tiny_builds: dict[str, str], tiny_planted: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """issue 27: a hand-touch loop with the wrong stride (only kernels before 5.14 touch by
    hand) kept every compared field; the pages the buffer has faulted when alloc returns show
    it, and only on those kernels."""
    argv = ["compare", tiny_builds["wrap"], tiny_planted["stride_bug"], "--no-scenarios"]
    argv += ["-k", "*alloc(size=4194304, Anonymous, *numa_node=1, prefault=True)", "--json"]
    assert main(argv) == 1
    doc = json.loads(capsys.readouterr().out)
    assert list(doc["differences"]) == ["faulted"]
    by_run = {d["run"]: (d["a"], d["b"]) for d in doc["differences"]["faulted"]}
    assert by_run and all(("k3.10.0" in r or "k4.9.0" in r or "k5.10.0" in r) for r in by_run)
    assert set(by_run.values()) == {("1024 x 4KiB", "2 x 4KiB")}


def test_a_free_that_keeps_the_handle_differs_after_free(
    tiny_builds: dict[str, str], tiny_planted: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """issue 27: compare read the handle before Free only; a free whose munmap fails and that
    leaves the handle valid differs in "after free" (each run frees twice: the second is a
    no-op for the correct build, which leaks the mapping its failed munmap kept; the planted one
    unmaps it then, so they differ in "leak" too)."""
    argv = ["compare", tiny_builds["wrap"], tiny_planted["free_keeps_handle"], "--no-scenarios"]
    assert main([*argv, "-k", "*munmap:EINVAL] alloc(size=4194304,*", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert list(doc["differences"]) == ["leak", "after free"]
    # field by field (issue 41): a free keeps the backing and alignment, as mori's does
    values = [(d["a"], d["b"]) for d in doc["differences"]["after free"]]
    assert (
        values
        == [
            (
                {"valid": False, "ptr": 0, "requested_size": 0, "mapped_size": 0},
                {"valid": True, "ptr": "set", "requested_size": 4194304, "mapped_size": 4194304},
            )
        ]
        * 4
    )
    assert len(doc["differences"]["after free"]) == doc["runs"] == 4  # one per backing


@pytest.mark.parametrize(
    ("planted", "pattern", "classes"),
    [
        # rounding past 2^64: the fallback warns where the check refused quietly
        ("no_overflow_check", "*alloc(size=1844674407*Hugetlb, *", ["warning count"]),
        # 16 GiB pages encoded from their low 32 bits: the default size, whose pool is empty
        ("size_32", "[[]ppc64le-16GiB-pages *", ["backing", "alignment", "warning count"]),
        ("requested_rounded", "[[]ample k6.8.0] alloc(size=1, Anonymous, *", ["requested_size"]),
        # MADV_POPULATE_READ maps the zero page: nothing faulted (kernels from 5.14)
        ("populate_read", "[[]ample k6.8.0] alloc(size=3145728, Anonymous, *", ["faulted"]),
        # a memfd mapped private: the fd handed out never sees the buffer's writes
        ("shm_private", "[[]ample k6.8.0] alloc(size=3145728, AnonymousShm, *", ["mapping"]),
        # a memfd without MFD_CLOEXEC: every program the process execs holds the buffer's pages
        ("no_cloexec", "[[]ample k6.8.0] alloc(size=3145728, AnonymousShm, *", ["mapping"]),
        # the mbind failure's line at [error]: the same text, another level (issue 41)
        ("mbind_error_level", "[[]ample k6.8.0] alloc(*numa_node=63*", ["log level"]),
    ],
)
def test_planted_bugs_the_quick_matrix_reaches(
    tiny_builds: dict[str, str],
    tiny_planted: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    planted: str,
    pattern: str,
    classes: list[str],
) -> None:
    """issue 27: bugs a held-back set of mori mutants showed the default compare did not reach
    (the top of size_t, hugepages of 2^32 bytes or more, the handle's requested_size, a read
    prefault, a memfd mapped private or kept across exec); each differs in its class and only
    there."""
    argv = ["compare", tiny_builds["wrap"], tiny_planted[planted], "--no-scenarios"]
    assert main([*argv, "-k", pattern, "--json"]) == 1, capsys.readouterr().err
    doc = json.loads(capsys.readouterr().out)
    assert list(doc["differences"]) == classes


FIELD_100GIB = "[[]field-256GiB k4.18.0] alloc(size=107374182400, *"


def test_field_sized_buffers_are_touched_by_hand_in_the_quick_matrix(
    tiny_builds: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """issue 41: 100 GiB prefaulted on RHEL 8's 4.18 (no MADV_POPULATE_WRITE): the built-in
    allocator's one touch of the range and the test allocator's loop over every page (one fault
    per granted run under the interposer) end alike, in seconds: ok, every page faulted; only
    the fallback's warning text differs."""
    argv = ["compare", "umbp-sim", tiny_builds["wrap"], "--no-scenarios", "-k", FIELD_100GIB]
    assert main([*argv, "--run-timeout", "30", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["runs"] == 4  # every backing
    assert list(doc["differences"]) == ["warning text"]


def test_a_touch_loop_with_a_32_bit_offset_times_out_past_4_gib(
    tiny_builds: dict[str, str], tiny_planted: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """issue 41: a touch by hand whose offset is 32 bits wraps at 4 GiB and never ends: the
    quick matrix's field-sized runs on 4.18 time out where the build without the bug is done."""
    argv = ["compare", tiny_builds["wrap"], tiny_planted["offset_32"], "--no-scenarios"]
    argv += ["-k", "[[]field-256GiB k4.18.0] alloc(size=5368709120, Anonymous, *"]
    assert main([*argv, "--run-timeout", "3", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert list(doc["differences"]) == ["outcome"]
    [item] = doc["differences"]["outcome"]
    assert (item["a"], item["b"]) == ("ok Anonymous", "timed out after 3 s in alloc")
