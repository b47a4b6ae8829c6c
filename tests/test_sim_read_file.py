"""SimKernel.read_file renders only the file asked for: it must read what render_all shows."""

from __future__ import annotations

import pytest

from umbp_sim.machine import Machine
from umbp_sim.sim import SimHost


@pytest.mark.parametrize(
    "machine",
    [
        Machine.x86_64(nodes=3, hugepages={"2MiB": 64, "1GiB": 1}),
        Machine.x86_64(nodes=12, hugepages={"2MiB": 24}),
        Machine.arm64(page_size="64KiB"),
    ],
    ids=["3-nodes", "12-nodes", "arm64-64k"],
)
def test_read_file_is_render_all_for_every_path(machine):
    host = SimHost(machine)
    files = host.kernel.render_all()
    assert "/sys/devices/system/node/node1/meminfo" in files or len(machine.nodes) == 1
    for path, text in files.items():
        assert host.kernel.read_file(path) == text, path


@pytest.mark.parametrize(
    "path",
    [
        "/proc/nope",
        "/proc/sys/vm/nope",
        "/sys/devices/system/node/node9/meminfo",  # node 1 exists, node 9 does not
        "/sys/devices/system/node/node1/nope",
        "/sys/devices/system/node/node",
        "/sys/kernel/mm/hugepages/hugepages-4kB/nr_hugepages",
        "",
    ],
)
def test_read_file_of_a_missing_path_is_enoent(path):
    host = SimHost(Machine.x86_64(nodes=2))
    with pytest.raises(FileNotFoundError):
        host.kernel.read_file(path)
