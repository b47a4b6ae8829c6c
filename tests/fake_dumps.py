"""Test helpers that build dumps and fake hosts: a tarball from {name: contents}, a fake root
directory, and the cgroup v2 host both collectors (umbp_sim/live_dump.py and the stand-alone
scripts) are run on."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Mapping
from pathlib import Path

# A host whose job runs in the cgroup v2 /job/step: the parent's memory.max binds; per 2 MiB
# hugepages, the fault-time limit (hugetlb.2MB.max) and the reservation one (rsvd.max).
CGROUP_V2_HOST = {
    "proc/meminfo": "MemTotal: 1048576 kB\nHugepagesize: 2048 kB\n",
    "proc/self/cgroup": "0::/job/step\n",
    "proc/self/mountinfo": "41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
    "sys/fs/cgroup/job/memory.max": "4294967296\n",
    "sys/fs/cgroup/job/step/memory.max": "max\n",
    "sys/fs/cgroup/job/step/hugetlb.2MB.max": "2097152\n",
    "sys/fs/cgroup/job/step/hugetlb.2MB.rsvd.max": "4194304\n",
    "sys/fs/cgroup/job/hugetlb.2MB.rsvd.max": "max\n",
    "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages": "3\n",
    "proc/sys/kernel/osrelease": "5.15.0\n",
}


def write_tree(root: Path, files: Mapping[str, str]) -> Path:
    """Write ``files`` ({relative path: text}) under ``root``; returns ``root``."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def tar_bytes(files: Mapping[str, bytes], mode: str = "w") -> bytes:
    """A tarball of regular files ({member name: contents}) in memory."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:  # type: ignore[call-overload]
        for name, raw in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return buf.getvalue()
