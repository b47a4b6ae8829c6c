"""A killed test run restores the host (issue 16 item 8): the originals are recorded beside the
pool lock before a change, and the next test run, guard or .ci/run puts them back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require_root

state = sys.modules["umbp_sim_hugepage_state"]  # tools/hugepage_state.py, loaded by conftest
TOOL = Path(__file__).resolve().parent.parent / "tools" / "hugepage_state.py"
NR = Path("/proc/sys/vm/nr_hugepages")

# A test run that changes the pool the way the nr_hugepages fixture does, then dies.
VICTIM = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("hs", sys.argv[1])
hs = importlib.util.module_from_spec(spec); spec.loader.exec_module(hs)
with hs.locked():
    hs.write_record(hs.snapshot())
    with open("/proc/sys/vm/nr_hugepages", "w") as f:
        f.write(sys.argv[2] + "\\n")
    print("changed", flush=True)
    time.sleep(600)
"""


@pytest.mark.realkernel
def test_sigkilled_run_is_restored_by_the_next_start() -> None:
    require_root("changes vm.nr_hugepages")
    with state.locked():
        original = NR.read_text().strip()
        assert not os.path.lexists(state.RECORD), "a stale record before the test"
    child = subprocess.Popen(
        [sys.executable, "-c", VICTIM, str(TOOL), str(int(original) + 2)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "changed\n"
        os.kill(child.pid, signal.SIGKILL)  # no finalizer runs
        child.wait(timeout=30)
        with state.locked():  # no other test run restores it before we look
            assert NR.read_text().strip() == str(int(original) + 2)
            record = json.loads(Path(state.RECORD).read_text())
            assert record["/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"] == original
        # what .ci/run (before and after), sysctl_guard and each pytest session start run
        out = subprocess.run(
            [sys.executable, str(TOOL), "restore"], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        assert out.stderr.startswith(
            "hugepage_state: restored the hugepage pools a killed test run left changed: "
        )
        assert (
            f"/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages: {int(original) + 2} -> "
            f"{original}"
        ) in out.stderr
        assert NR.read_text().strip() == original
        assert not os.path.lexists(state.RECORD)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        with state.locked():
            NR.write_text(original + "\n")
            if os.path.lexists(state.RECORD):
                os.unlink(state.RECORD)


@pytest.mark.realkernel
def test_nothing_to_restore_is_quiet() -> None:
    require_root("takes the pool lock of root's test runs")
    with state.locked():  # a record may exist while its owner (an xdist worker) holds the lock
        if os.path.lexists(state.RECORD):
            pytest.fail(f"{state.RECORD} exists: a killed run was not restored at session start")
    out = subprocess.run([sys.executable, str(TOOL), "restore"], capture_output=True, text=True)
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "")


def test_lock_file_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("")
    lock = tmp_path / "pool.lock"
    lock.symlink_to(target)
    with pytest.raises(state.StateError) as exc:
        with state.locked(str(lock)):
            pass
    assert str(exc.value) == (f"lock file {lock}: cannot open: Too many levels of symbolic links")


def test_record_names_only_pool_knobs(tmp_path: Path) -> None:
    record = tmp_path / "saved"
    record.write_text(json.dumps({"/etc/passwd": "0"}))
    with pytest.raises(state.StateError) as exc:
        state.read_record(str(record))
    assert str(exc.value) == f"record {record}: '/etc/passwd' = '0' is not a pool knob and a count"
    record.unlink()
    record.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(state.StateError, match="cannot open: Too many levels of symbolic links"):
        state.read_record(str(record))


def test_record_is_replaced_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    record = tmp_path / "saved"
    record.symlink_to(victim)
    knob = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"
    state.write_record({knob: "3"}, str(record))
    assert victim.read_text() == "precious\n"
    assert not record.is_symlink() and state.read_record(str(record)) == {knob: "3"}
