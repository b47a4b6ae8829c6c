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
from umbp_sim.external import mori_build

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
        f"umbp-sim build-allocator: -o {out}: its directory {out.parent} does not exist\n"
    )
    assert main(["build-allocator", "--mori", str(checkout), "-o", str(tmp_path)]) == 73
    assert capsys.readouterr().err == f"umbp-sim build-allocator: -o {tmp_path}: is a directory\n"


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
