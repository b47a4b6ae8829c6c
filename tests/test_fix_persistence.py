"""Beside each live command of a fix, what makes it last past a reboot (issue 28, item 5)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from umbp_sim.cli import main
from umbp_sim.diagnose.fix import Fix, combine
from umbp_sim.diagnose.persist import boot_size, persistent
from umbp_sim.diagnose.pool_writes import overcommit_write, pool_write
from umbp_sim.machine import Machine

NODE0 = "echo 2064 > /sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages"
G1 = 1 << 30
M2 = 2 << 20


def fix(**data: Any) -> Fix:
    """A fix with only what persistence reads: its admin writes, sysctls, service limits."""
    return Fix("a change", ["(its live commands are not read)"], "pool", **data)


@pytest.mark.parametrize(
    ("fixes", "kernel", "said"),
    [
        ([fix(host_changes=[pool_write(M2, 4096)]), fix(sysctls={"vm.overcommit_memory": "1"})],
         "6.8.0",
         ["/etc/sysctl.d/90-hugepages.conf: vm.nr_hugepages = 4096; vm.overcommit_memory = 1"]),
        ([fix(host_changes=[pool_write(G1, 4)])], "6.8.0",
         ["kernel command line: hugepagesz=1G hugepages=4"]),
        ([fix(host_changes=[pool_write(M2, 2064, 0)])], "5.16.0",
         ["kernel command line: hugepagesz=2M hugepages=0:2064"]),
        ([fix(host_changes=[pool_write(M2, 2064, 0)])], "5.15.0",
         [f"a unit run at boot: {NODE0}"]),  # no NODE:COUNT before 5.16
        ([fix(host_changes=[overcommit_write(G1, 2)])], "6.8.0",
         ["a unit run at boot: echo 2 > "
          "/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_overcommit_hugepages"]),
        ([fix(service=["echo max > /sys/fs/cgroup/<server cgroup>/memory.max"])], "6.8.0",
         ["the limits the server's service or container starts it with: "
          "echo max > /sys/fs/cgroup/<server cgroup>/memory.max"]),
        ([fix(), fix()], "6.8.0", []),  # a change of the request: the server's configuration
    ],
)  # fmt: skip
def test_each_host_change_has_its_boot_form(fixes: list[Fix], kernel: str, said: list[str]) -> None:
    assert persistent(combine(fixes), Machine.x86_64(kernel_version=kernel)) == said


def test_boot_sizes_are_the_kernels_spelling() -> None:
    assert [boot_size(s) for s in (64 << 10, 2 << 20, 16 << 20, 1 << 30, 16 << 30)] == [
        "64K", "2M", "16M", "1G", "16G",
    ]  # fmt: skip


def test_replay_says_it_beside_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    dump = Path(__file__).parent / "data" / "replay" / "dpdk-socket0-5.15.0"
    argv = ["replay", str(dump), "--size", "4096MiB", "--numa-node", "0", "--allocator", "umbp-sim"]
    assert main([*argv, "--json"]) == 0
    (fix,) = [f for f in json.loads(capsys.readouterr().out)["fixes"] if NODE0 in f["commands"]]
    assert fix["persistent"] == [f"a unit run at boot: {NODE0}"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert f"        {NODE0}\n      after a reboot too: a unit run at boot: {NODE0}\n" in text
