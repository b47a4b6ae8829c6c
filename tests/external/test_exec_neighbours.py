"""``umbp-sim exec`` next to what is already there (issue 43 item 6): a library the user
preloads, a sanitizer runtime, a program the interposer cannot reach (static, set-user-ID), an
umbp-sim started under exec, a stray exec variable. Each works, or is refused in one line that
says why; a program that ran on the real host is never reported as simulated."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
from build_cache import cached_build

from umbp_sim.external.exec_program import inspect, preload_list

from .exec_support import run_exec

HERE = Path(__file__).resolve().parent
SIMULATED = {  # what exec_probe.c prints on the default host, whatever this box has
    "nodes": "2", "page size": "4096", "mmap": "ok", "mbind": "ok", "touch": "ok",
    "page node": "1", "HugePages_Free": "2047",
}  # fmt: skip


def _lines(out: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in out.splitlines())


@pytest.fixture(scope="session")
def static_program(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A static program that exits 3."""
    d = tmp_path_factory.mktemp("static")
    (d / "static.c").write_text("int main(void) { return 3; }\n")
    out = str(d / "static_exit3")
    return cached_build(["cc", "-static", "-O1", str(d / "static.c"), "-o", out], out)


@pytest.fixture(scope="session")
def asan_probe(tmp_path_factory: pytest.TempPathFactory) -> str:
    """exec_probe.c built with gcc's AddressSanitizer (libasan.so as a DT_NEEDED)."""
    out = str(tmp_path_factory.mktemp("asan") / "exec_probe_asan")
    cmd = ["cc", "-std=gnu11", "-fsanitize=address", "-O1", str(HERE / "exec_probe.c"), "-o", out]
    return cached_build(cmd, out)


def test_a_library_preloaded_already_goes_after_the_interposer(probe: str, tmp_path: Path) -> None:
    """LD_PRELOAD=libc.so.6 put the C library before the interposer: its look-up of the real
    calls found nothing and the program died of SIGSEGV (139). It goes after it now."""
    done = run_exec(tmp_path, "--", probe, env={"LD_PRELOAD": "libc.so.6"})
    assert done.returncode == 0, done.stderr
    assert _lines(done.stdout) == SIMULATED


def test_a_library_put_before_the_interposer_stops_the_program_in_one_line(
    probe: str, tmp_path: Path
) -> None:
    """A program started with a library before the interposer (a wrapper that prepends to
    LD_PRELOAD) would run with its calls on the real host: it is stopped before main(), exit
    70, one line naming the library."""
    script = f'LD_PRELOAD="libc.so.6 $LD_PRELOAD" exec {probe}'
    done = run_exec(tmp_path, "--", "sh", "-c", script)
    assert (done.returncode, done.stdout) == (70, "")
    assert re.fullmatch(
        r"umbp-sim exec: the simulated host did not start: LD_PRELOAD: \S*libc\.so\.6 is loaded "
        r"before the interposer and answers the program's mmap; preload it after the "
        r"interposer\n",
        done.stderr,
    ), done.stderr


def test_the_preload_order() -> None:
    """Sanitizer runtimes first (the user's, then the program's own, once each), the
    interposer, then the rest in the user's order; spaces and colons both separate."""
    assert preload_list("", "/i.so") == "/i.so"
    assert preload_list("libc.so.6 /x/libasan.so.8:libfoo.so /i.so", "/i.so") == (
        "/x/libasan.so.8 /i.so libc.so.6 libfoo.so"
    )
    assert preload_list("/x/libasan.so.8", "/i.so", ("libasan.so.8", "libtsan.so.2")) == (
        "/x/libasan.so.8 libtsan.so.2 /i.so"
    )


def test_an_asan_program_gets_its_runtime_before_the_interposer(
    asan_probe: str, tmp_path: Path
) -> None:
    """A program linked with libasan refuses to start unless its runtime is loaded first; it
    was reported as "a static or set-user-ID program". Its runtime is preloaded before the
    interposer, the program runs on the simulated host, and the paragraph says so."""
    program = inspect(asan_probe, dict(os.environ))
    assert program is not None and program.unreachable is None
    (runtime,) = program.sanitizers
    assert re.fullmatch(r"libasan\.so\.\d+", runtime)
    done = run_exec(tmp_path, "--json", "r.json", "--", asan_probe, env={"ASAN_OPTIONS": ""})
    assert done.returncode == 0, done.stderr
    assert _lines(done.stdout) == SIMULATED
    # LeakSanitizer's scan at exit reads the simulated host's trapped mappings and crashes
    said = f"its sanitizer runtime {runtime} loaded before the interposer (LeakSanitizer off); "
    assert said in done.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["sanitizer_runtimes"] == [runtime] and report["not_simulated"] is None
    assert report["leak_check_off"] is True
    assert report["simulated_calls"] >= 4


def test_a_static_program_is_refused_unless_allowed_on_the_real_host(
    static_program: str, tmp_path: Path
) -> None:
    """A static program loads no interposer: it ran on this box while the report said it ran on
    the simulated host. It is refused in one line; --allow-real-host runs it, and the report
    says where it ran."""
    done = run_exec(tmp_path, "--", static_program)
    assert (done.returncode, done.stdout) == (64, "")
    assert done.stderr == (
        f"umbp-sim exec: CMD {static_program}: a static program (no dynamic loader to preload "
        "into): the interposer cannot reach it, so it would run on this box's real host, not the "
        "simulated one (--allow-real-host runs it there)\n"
    )
    done = run_exec(tmp_path, "--allow-real-host", "--json", "r.json", "--", static_program)
    assert done.returncode == 3, done.stderr
    assert re.fullmatch(
        r"umbp-sim exec: `\S+` ran on this box's real host, not on the simulated host ample "
        r"\(named machine ample: [^)]*\): it is a static program \(no dynamic loader to preload "
        r"into\), which the interposer cannot reach \(--allow-real-host\)\. Exit status 3\.\n",
        done.stderr,
    ), done.stderr
    assert "calls answered" not in done.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["not_simulated"].startswith("a static program")
    assert report["simulated_calls"] is None and report["exit_status"] == 3


def test_a_script_is_judged_by_its_interpreter(static_program: str, tmp_path: Path) -> None:
    script = tmp_path / "script"
    script.write_text(f"#!{static_program}\n")
    script.chmod(0o755)
    done = run_exec(tmp_path, "--", str(script))
    assert done.returncode == 64
    assert done.stderr.startswith(f"umbp-sim exec: CMD {script}: a static program ")


def _setuid_program(tmp_path: Path) -> tuple[str, str]:
    """A set-user-ID program this user would run in the loader's secure mode, and the owner
    the message names: as root, a copy of true owned by nobody; otherwise a system one."""
    if os.getuid() == 0:
        copy = tmp_path / "setuid_true"
        shutil.copy(shutil.which("true") or "/bin/true", copy)
        os.chown(copy, 65534, 65534)
        copy.chmod(0o4755)
        return str(copy), "65534"
    for name in ("su", "passwd", "mount", "chsh", "newgrp"):
        path = shutil.which(name) or f"/usr/bin/{name}"
        if os.path.exists(path) and os.stat(path).st_mode & 0o4000:
            return path, str(os.stat(path).st_uid)
    pytest.fail("no set-user-ID program on this box to run as a user")


def test_a_set_user_id_program_is_refused(tmp_path: Path) -> None:
    """The loader ignores LD_PRELOAD for a set-user-ID program that changes the user: it would
    run on the real host. Refused in one line, before anything runs. (On a nosuid mount the
    bit changes nobody's id: it runs under the interposer there.)"""
    program, owner = _setuid_program(tmp_path)
    nosuid = os.statvfs(program).f_flag & os.ST_NOSUID
    try:
        done = run_exec(tmp_path, "--json", "r.json", "--", program, "--help")
    finally:
        if program.startswith(str(tmp_path)):
            os.unlink(program)  # a set-user-ID file is not left behind
    if nosuid:
        report = json.loads((tmp_path / "r.json").read_text())
        assert report["not_simulated"] is None and report["simulated_calls"] is not None
        return
    assert (done.returncode, done.stdout) == (64, "")
    assert done.stderr == (
        f"umbp-sim exec: CMD {program}: a set-user-ID program (owner uid {owner}): the "
        "interposer cannot reach it, so it would run on this box's real host, not the simulated "
        "one (--allow-real-host runs it there)\n"
    )


def test_umbp_sim_under_exec_runs_as_it_does_outside(
    tiny_builds: dict[str, str], tmp_path: Path
) -> None:
    """An umbp-sim started under exec leaves the program's host: it starts again without the
    interposer and the exec variables. Its allocator servers inherited them, and `compare`
    reported "crash SIGSEGV in start" for every run of an external allocator that ran fine."""
    runs = "*pool-on-node0 k6.8.0] alloc(size=4096, Anonymous,*"
    nested = run_exec(
        tmp_path, "--json", "r.json", "--", sys.executable, "-m", "umbp_sim.cli", "compare",
        tiny_builds["preload"], "umbp-sim", "--no-scenarios", "-k", runs, "--json",
    )  # fmt: skip
    assert nested.returncode == 0, nested.stderr
    doc = json.loads(nested.stdout)
    assert (doc["runs"], doc["differing_runs"], doc["differences"]) == (2, 0, {})
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["other_processes"] == [] and report["death"] is None


def test_a_stray_exec_variable_is_not_an_allocator_servers(
    tiny_builds: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """UMBP_SIM_EXEC left in umbp-sim's environment (by a shell, a wrapper) started that host
    in every allocator server, which then "could not run". A server never inherits it."""
    from umbp_sim.allocator_spec import parse_allocator_spec
    from umbp_sim.comparison.matrix import machine
    from umbp_sim.engine.spec import Alloc, Run
    from umbp_sim.request import AllocRequest
    from umbp_sim.run_router import open_allocator

    monkeypatch.setenv("UMBP_SIM_EXEC", str(tmp_path / "no-such-host"))
    monkeypatch.setenv("UMBP_SIM_EXEC_EVIDENCE", "3:0:0")
    tiny = open_allocator(parse_allocator_spec(tiny_builds["preload"]))
    try:
        run = Run(machine("ample"), Alloc(AllocRequest(4096), write=True, free=True))
        record = tiny.run(run)
    finally:
        tiny.close()
    assert record.outcome == "ok", record
