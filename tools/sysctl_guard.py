#!/usr/bin/env python3
"""Run a command and check that it left the memory sysctls as it found them.

    python tools/sysctl_guard.py -- pytest tests/test_differential.py

Reads every vm.* hugepage/overcommit knob and every per-size (and per-node) hugepage pool
before the command; after it, anything changed is reported, written back, and the run fails
(exit 1) even if the command passed. Tests must restore what they change in their own
finalizers; this is the safety net that proves they did. Before the snapshot, pools a killed
test run left changed are restored from its record (tools/hugepage_state.py).
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # even with PYTHONSAFEPATH
import hugepage_state  # noqa: E402

KNOBS = [
    "/proc/sys/vm/nr_hugepages",
    "/proc/sys/vm/nr_overcommit_hugepages",
    "/proc/sys/vm/overcommit_memory",
    "/proc/sys/vm/overcommit_ratio",
    "/proc/sys/vm/overcommit_kbytes",
    "/proc/sys/vm/hugetlb_shm_group",
    *sorted(glob.glob("/sys/kernel/mm/hugepages/hugepages-*/nr_hugepages")),
    *sorted(glob.glob("/sys/kernel/mm/hugepages/hugepages-*/nr_overcommit_hugepages")),
    *sorted(glob.glob("/sys/devices/system/node/node*/hugepages/hugepages-*/nr_hugepages")),
]


def snapshot() -> dict[str, str]:
    out = {}
    for k in KNOBS:
        try:
            out[k] = Path(k).read_text().strip()
        except OSError:
            pass
    return out


def main(argv: list[str]) -> int:
    cmd = argv[1:] if argv[:1] == ["--"] else argv
    if not cmd:
        print("usage: sysctl_guard.py -- COMMAND [ARGS...]", file=sys.stderr)
        return 64
    # A test run killed earlier (its finalizers never ran) left a pool changed: undo that
    # first, so it is neither blamed on this command nor taken as the state to keep.
    try:
        for line in hugepage_state.restore_stale():
            print(f"sysctl_guard: {line}", file=sys.stderr)
    except hugepage_state.StateError as e:
        print(f"sysctl_guard: {e}", file=sys.stderr)
        return 1
    before = snapshot()
    rc = subprocess.run(cmd).returncode
    after = snapshot()
    changed = [k for k in before if after.get(k) != before[k]]
    # Per-node pools move when the global one is restored; restore globals first, then check.
    for k in sorted(changed, key=lambda k: "/node/" in k):
        try:
            Path(k).write_text(before[k] + "\n")
        except OSError as e:
            print(f"sysctl_guard: cannot restore {k}: {e}", file=sys.stderr)
    for k in changed:
        print(f"sysctl_guard: {k} was {before[k]}, left at {after.get(k)}", file=sys.stderr)
    if changed:
        return 1
    print(f"sysctl_guard: {len(before)} memory sysctls unchanged")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
