"""Beside each live command of a fix, what makes it last past a reboot (issue 28, item 5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from umbp_sim.cli import main
from umbp_sim.diagnose.persist import boot_size, persistent
from umbp_sim.machine import Machine

NODE0 = "echo 2064 > /sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages"


@pytest.mark.parametrize(
    ("commands", "kernel", "said"),
    [
        (["sysctl -w vm.nr_hugepages=4096", "sysctl -w vm.overcommit_memory=1"], "6.8.0",
         ["/etc/sysctl.d/90-hugepages.conf: vm.nr_hugepages = 4096; vm.overcommit_memory = 1"]),
        (["echo 4 > /sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages"], "6.8.0",
         ["kernel command line: hugepagesz=1G hugepages=4"]),
        ([NODE0], "5.16.0", ["kernel command line: hugepagesz=2M hugepages=0:2064"]),
        ([NODE0], "5.15.0", [f"a unit run at boot: {NODE0}"]),  # no NODE:COUNT before 5.16
        (["echo max > /sys/fs/cgroup/<server cgroup>/memory.max"], "6.8.0",
         ["the limits the server's service or container starts it with: "
          "echo max > /sys/fs/cgroup/<server cgroup>/memory.max"]),
        (["--numa-node 1", "SGLANG_HICACHE_HOST_NUMA_NODE=-1"], "6.8.0", []),  # the server's
    ],
)  # fmt: skip
def test_each_live_command_has_its_boot_form(
    commands: list[str], kernel: str, said: list[str]
) -> None:
    assert persistent(commands, Machine.x86_64(kernel_version=kernel)) == said


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
