"""``umbp-sim build-allocator --mori CHECKOUT -o OUT``: a mori checkout's allocator with
umbp-sim's binding, loaded before "built"; the output checked before compiling;
``--print-command`` builds nothing. The checkout is tests/external/fake_mori (mori's layout and
header, a small allocator of its own)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from umbp_sim.cli import main
from umbp_sim.toolchain import mori_build

FAKE = Path(__file__).resolve().parent / "fake_mori"


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    out = tmp_path / "mori"
    shutil.copytree(FAKE, out)
    return out


def test_a_checkout_builds_loads_and_runs_as_allocator(
    checkout: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "mori_umbp.so"
    assert main(["build-allocator", "--mori", str(checkout), "-o", str(out)]) == 0
    assert capsys.readouterr().out == f"built {out}\n"
    # the build is an allocator umbp-sim runs on a simulated host
    code = main(["preflight", "--size", "8KiB", "--backing", "anonymous", "--allocator", str(out),
                 "--json"])  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert (code, doc["outcome"], doc["actual_backing"]) == (0, "ok", "Anonymous"), doc


def test_print_command_builds_nothing(
    checkout: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "mori_umbp.so"
    assert (
        main(["build-allocator", "--mori", str(checkout), "-o", str(out), "--print-command"]) == 0
    )
    cmd = capsys.readouterr().out
    assert cmd.count("\n") == 1
    assert str(checkout / mori_build.SOURCE) in cmd and mori_build.binding_source() in cmd
    assert "-DUMBP_SIM_MODULE_NAME=mori_umbp" in cmd and f"-I{checkout / 'src/umbp/include'}" in cmd
    assert not out.exists()


def test_an_unwritable_output_is_exit_73_before_compiling(
    checkout: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The allocator does not compile: exit 73, not 65, shows nothing was compiled first.
    (checkout / mori_build.SOURCE).write_text("this is not C++\n")
    out = tmp_path / "missing" / "mori_umbp.so"
    assert main(["build-allocator", "--mori", str(checkout), "-o", str(out)]) == 73
    assert capsys.readouterr().err == (
        f"umbp-sim build-allocator: -o {out}: cannot write: No such file or directory\n"
    )
    assert main(["build-allocator", "--mori", str(checkout), "-o", str(tmp_path)]) == 73
    assert capsys.readouterr().err == (
        f"umbp-sim build-allocator: -o {tmp_path}: a directory, not a regular file: refused\n"
    )


def test_not_a_checkout_and_bad_usage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "m.so")
    assert main(["build-allocator", "--mori", str(tmp_path), "-o", out]) == 65
    assert capsys.readouterr().err == (
        f"umbp-sim build-allocator: --mori {tmp_path}: not a mori checkout (no "
        "src/umbp/local/host_mem_allocator.cpp)\n"
    )
    with pytest.raises(SystemExit) as exc:
        main(["build-allocator", "a.cpp", "--mori", str(tmp_path), "-o", out])
    assert exc.value.code == 64
    assert capsys.readouterr().err.endswith(
        "error: give the sources (SRC ...) or --mori CHECKOUT, not both\n"
    )
    with pytest.raises(SystemExit) as exc:
        main(["build-allocator", "-o", out])
    assert exc.value.code == 64
    assert capsys.readouterr().err.endswith(
        "error: give the sources (SRC ...) or --mori CHECKOUT\n"
    )
    assert (
        main(["build-allocator", "--mori", str(FAKE), "-o", str(tmp_path / "mori-umbp.so")]) == 65
    )
    assert capsys.readouterr().err == (
        f"umbp-sim build-allocator: -o {tmp_path / 'mori-umbp.so'}: 'mori-umbp' is not a Python "
        "module name (name it like mori_umbp.so)\n"
    )


def test_a_build_that_does_not_load_names_the_symbol(
    checkout: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "mori_umbp.so"
    argv = ["build-allocator", "--mori", str(checkout), "-D", "FAKE_MORI_UNDEFINED", "-o", str(out)]
    assert main(argv) == 65
    err = capsys.readouterr().err
    assert err == (
        f"umbp-sim build-allocator: {out} was built but does not load: undefined symbol "
        "fmt::missing_vformat(int) (spdlog on an external fmt: --link-arg=-lfmt)\n"
    ), err


def test_spdlog_is_found_and_linked_as_it_was_built(tmp_path: Path) -> None:
    """The link arguments follow the installed spdlog's configuration macros."""
    inc = tmp_path / "inc"
    (inc / "spdlog").mkdir(parents=True)
    header = inc / "spdlog" / "spdlog.h"
    header.write_text("#define SPDLOG_FMT_EXTERNAL\n#define SPDLOG_COMPILED_LIB\n")
    assert mori_build.spdlog_link_args("c++", [str(inc)]) == ["-lspdlog", "-lfmt"]
    header.write_text("#define SPDLOG_HEADER_ONLY\n")
    assert mori_build.spdlog_link_args("c++", [str(inc)]) == []


def test_a_checkout_without_spdlog_names_the_packages(
    checkout: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a header no host has stands for spdlog's: the answer must not depend on this host
    monkeypatch.setattr(mori_build, "SPDLOG_HEADER", "umbp-sim-test-absent/spdlog.h")
    (checkout / mori_build.LOG_HEADER).write_text("#pragma once\n#include <spdlog/spdlog.h>\n")
    assert main(["build-allocator", "--mori", str(checkout), "-o", str(tmp_path / "m.so")]) == 65
    assert capsys.readouterr().err == (
        "umbp-sim build-allocator: mori logs through spdlog (include/mori/utils/mori_log.hpp) "
        "and the compiler finds no umbp-sim-test-absent/spdlog.h: apt-get install "
        "libspdlog-dev (Debian, Ubuntu) or dnf install spdlog-devel; or -I the directory "
        "holding spdlog/\n"
    )


REGISTRY_SCENARIO = """umbp_sim_scenario = 1
[scenario]
name = "registry"
description = "registered twice, released once, freed: mapped until the last release"

[machine]
nodes = 1
mem_per_node = "16GiB"

[request]
kind = "steps"
steps = [
  { op = "alloc", id = "kv", size = "64KiB", backing = "AnonymousShm" },
  { op = "acquire", id = "kv", offset = 4096, size = "4KiB" },
  { op = "acquire", id = "kv", offset = 8192, size = "4KiB" },
  { op = "release", id = "kv" },
  { op = "free", id = "kv" },
  { op = "mapped", id = "kv" },
  { op = "lookup", id = "kv", offset = 4096, size = "4KiB" },
  { op = "release", id = "kv" },
  { op = "mapped", id = "kv" },
]

[expect]
outcome = "ok"
steps = ["alloc ok AnonymousShm 65536", "acquire found 65536", "acquire found 65536",
         "released", "freed", "mapped yes", "lookup none", "released", "mapped no"]
no_leaks = true
"""


def test_the_shm_registry_runs_on_a_checkout_build(
    fake_mori_builds: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """mori's registry is C++ only: build-allocator's binding gives it to umbp-sim's steps, so
    a registry that miscounts (Acquire not counted: the Free unmaps at once) fails a scenario
    and differs in compare (class "steps")."""
    good, bug = fake_mori_builds["good"], fake_mori_builds["refcount_bug"]
    scn = tmp_path / "registry.toml"
    scn.write_text(REGISTRY_SCENARIO)
    capsys.readouterr()
    assert main(["run", "--allocator", good, str(scn)]) == 0, capsys.readouterr().out
    capsys.readouterr()
    assert main(["run", "--allocator", bug, str(scn)]) == 1
    out = capsys.readouterr().out
    assert "'freed', 'mapped no', 'lookup none'" in out, out
    # compare: the bundled mori scenario of the same sequence, on both builds
    pick = ["--matrix", "none", "-k", "*shm-free-deferred-until-last-release*", "--json"]
    assert main(["compare", good, good, *pick]) == 0
    assert json.loads(capsys.readouterr().out)["runs"] == 1
    assert main(["compare", good, bug, *pick]) == 1
    steps = json.loads(capsys.readouterr().out)["differences"]["steps"]
    assert [s[5] for s in (steps[0]["a"], steps[0]["b"])] == ["mapped yes", "mapped no"]


def test_every_shm_run_asks_the_registry_after_alloc_and_free(
    fake_mori_builds: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Each compared run asks the shm registry of its buffer after alloc and after its free
    (class "registry"): a build that registers the requested size, not the mapped one, differs
    in the matrix's shm runs of an unaligned size, not only in a registry scenario; one that
    registers no fd differs in every shm run (mori's handle has no fd: the record's must be one
    open on the buffer's memfd)."""
    good, bug, no_fd = (fake_mori_builds[n] for n in ("good", "requested_size", "no_fd"))
    pick = ["--no-scenarios", "-k", "*AnonymousShm,*", "--json"]
    capsys.readouterr()
    assert main(["compare", good, good, *pick]) == 0
    assert json.loads(capsys.readouterr().out)["differences"] == {}
    assert main(["compare", good, bug, *pick]) == 1
    found = json.loads(capsys.readouterr().out)["differences"]
    assert list(found) == ["registry"]
    one = next(d for d in found["registry"] if "alloc(size=1," in d["run"])
    assert (one["a"], one["b"]) == ("found 4096; after free none", "none; after free none")
    assert all("size=4194304," not in d["run"] for d in found["registry"])  # aligned: the same
    assert main(["compare", good, no_fd, *pick]) == 1
    found = json.loads(capsys.readouterr().out)["differences"]
    one = next(d for d in found["registry"] if "alloc(size=1," in d["run"])
    assert (one["a"], one["b"]) == (
        "found 4096; after free none",
        "found 4096 other fd; after free none",
    )


def test_a_build_without_the_registry_leaves_its_steps_out(
    tiny_builds: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    pick = ["--matrix", "none", "-k", "*shm-free-deferred-until-last-release*"]
    assert main(["compare", tiny_builds["wrap"], tiny_builds["wrap"], *pick]) == 64
    assert "no run's label matches" in capsys.readouterr().err


def test_mori_binding_builds_an_allocator_laid_out_another_way(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An allocator with mori's API whose files are elsewhere (a fork that moved them): its
    sources and --mori-binding, the header found through -I; the registry is reached too."""
    tree = tmp_path / "fork"
    (tree / "alloc").mkdir(parents=True)
    shutil.copy(FAKE / mori_build.SOURCE, tree / "alloc" / "pool.cpp")
    shutil.copytree(FAKE / "src/umbp/include", tree / "headers")
    shutil.copytree(FAKE / "include", tree / "third")
    out = tmp_path / "fork_umbp.so"
    argv = ["build-allocator", str(tree / "alloc" / "pool.cpp"), "--mori-binding"]
    argv += ["-I", str(tree / "headers"), "-I", str(tree / "third"), "-o", str(out)]
    assert main([*argv, "--print-command"]) == 0
    cmd = capsys.readouterr().out
    assert mori_build.binding_source() in cmd and "-DUMBP_SIM_MODULE_NAME=fork_umbp" in cmd
    assert cmd.count(f"-I{tree / 'headers'}") == 1
    assert main(argv) == 0
    assert capsys.readouterr().out == f"built {out}\n"
    pick = ["--matrix", "none", "-k", "*shm-free-deferred-until-last-release*", "--json"]
    assert main(["compare", "mori-624002c", str(out), *pick]) in (0, 1)
    doc = json.loads(capsys.readouterr().out)
    assert doc["runs"] == 1  # the registry scenario ran on the build (not left out)


def test_mori_binding_without_the_header_says_which(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "a.cpp"
    src.write_text("int x;\n")
    argv = ["build-allocator", str(src), "--mori-binding", "-I", str(tmp_path)]
    assert main([*argv, "-o", str(tmp_path / "a.so")]) == 65
    assert capsys.readouterr().err == (
        "umbp-sim build-allocator: --mori-binding: no -I directory holds "
        f"umbp/local/host_mem_allocator.h (mori's allocator header; -I: {tmp_path})\n"
    )
    with pytest.raises(SystemExit) as exc:
        main(["build-allocator", "--mori", str(FAKE), "--mori-binding", "-o", str(src)])
    assert exc.value.code == 64
    assert capsys.readouterr().err.endswith(
        "error: --mori-binding goes with SRC ... (--mori has the binding)\n"
    )


def test_every_field_of_the_handle_is_compared_before_and_after_free(
    fake_mori_builds: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """issue 41: compare read valid, ptr and the sizes after Free; a Free that resets the whole
    handle (its backing and alignment with it, which mori's keeps) differs in "after free" in
    every run that frees a buffer, those whose Free's munmap or close fails included; an
    invalid handle that still carries a backing and alignment (set before a mapping that
    failed) differs in "handle"."""
    out = fake_mori_builds
    pick = ["--no-scenarios", "-k", "[[]ample k6.8.0*] alloc(size=4194304, AnonymousShm,*"]
    pick.append("--json")
    capsys.readouterr()
    assert main(["compare", out["good"], out["good"], *pick]) == 0
    assert json.loads(capsys.readouterr().out)["differences"] == {}
    assert main(["compare", out["good"], out["reset"], *pick]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert list(doc["differences"]) == ["after free"]
    freed = {d["run"]: (d["a"], d["b"]) for d in doc["differences"]["after free"]}
    # every run that had a buffer to free: all but the three whose alloc failed
    failed = {"mmap:ENOMEM", "memfd_create:EMFILE", "ftruncate:ENOSPC"}
    assert len(freed) == doc["runs"] - len(failed)
    faults = {r.split("] ")[0].removeprefix("[ample k6.8.0").strip() for r in freed}
    assert faults == {"", "munmap:EINVAL", "madvise:EAGAIN", "mbind:EIO", "close:EIO"}
    assert all(
        v == ({"actual_backing": "AnonymousShm", "actual_alignment": 4096},
              {"actual_backing": "Anonymous", "actual_alignment": 0})
        for v in freed.values()
    )  # fmt: skip
    pick = ["--no-scenarios", "-k", "*mmap:ENOMEM] alloc(size=4194304,*", "--json"]
    assert main(["compare", out["good"], out["stale"], *pick]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert list(doc["differences"]) == ["handle"]
    stale = {d["run"].split(", ")[1]: (d["a"], d["b"]) for d in doc["differences"]["handle"]}
    assert stale == {
        "Anonymous": ({"actual_alignment": 0}, {"actual_alignment": 4096}),
        "AnonymousHugetlb": ({"actual_alignment": 0}, {"actual_alignment": 4096}),
        "AnonymousShm": ({"actual_backing": "Anonymous", "actual_alignment": 0},
                         {"actual_backing": "AnonymousShm", "actual_alignment": 4096}),
        "AnonymousShmHugetlb": ({"actual_backing": "Anonymous", "actual_alignment": 0},
                                {"actual_backing": "AnonymousShm", "actual_alignment": 4096}),
    }  # fmt: skip


SHM_ALLOC = """umbp_sim_scenario = 1
[scenario]
name = "{name}"
description = "a shm buffer of 64 KiB{why}"

[machine]
nodes = 1
mem_per_node = "16GiB"

[request]
size = "64KiB"
backing = "AnonymousShm"
{faults}
[expect]
outcome = "{outcome}"
"""


def test_run_checks_leaks_and_the_freed_handle_after_every_scenario(
    fake_mori_builds: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """issue 41: ``run --allocator BUILD`` passed a build that leaks an fd on a failure path
    and one whose Free resets the whole handle, where the scenario's [expect] said nothing of
    either; every scenario run on an external build is checked for both now."""
    out = fake_mori_builds
    freed = tmp_path / "freed.toml"
    freed.write_text(SHM_ALLOC.format(name="freed", why="", faults="", outcome="ok"))
    failed = tmp_path / "failed.toml"
    fault = '[[faults]]\nop = "mmap"\nerrno = "ENOMEM"\n'
    failed.write_text(SHM_ALLOC.format(name="failed", why=": mmap fails", faults=fault,
                                       outcome="failed"))  # fmt: skip
    capsys.readouterr()
    assert main(["run", "--allocator", out["good"], str(freed), str(failed)]) == 0
    assert capsys.readouterr().out.endswith("\n2 passed, 0 failed\n")
    assert main(["run", "--allocator", out["reset"], str(freed), str(failed)]) == 1
    report = capsys.readouterr().out
    assert report.endswith("\n1 passed, 1 failed\n")
    assert (
        f"{freed}: freed\n  handle after free: expected actual_backing 'AnonymousShm', "
        "actual_alignment 4096; got actual_backing 'Anonymous', actual_alignment 0\n" in report
    )
    assert main(["run", "--allocator", out["leaky"], str(freed), str(failed)]) == 1
    report = capsys.readouterr().out
    assert report.endswith("\n1 passed, 1 failed\n")
    assert (
        f"{failed}: failed\n  leaks: simulated fd 1000000 still open; fd 1000000 still open (an "
        "external build's run leaves nothing held unless [expect].no_leaks = false)\n" in report
    )
