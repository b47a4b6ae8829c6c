"""The C ABI to the kernel seam: header installed, capsule round trip, every call from C."""

from __future__ import annotations

import ctypes
import errno
import json
import signal
from pathlib import Path

import pytest

import umbp_sim
from umbp_sim import Machine, _native, capi
from umbp_sim.faults import FaultPlan
from umbp_sim.host.trace import instrument
from umbp_sim.sim import Reason, build_kernel


def _machine() -> Machine:
    # 2 nodes, the 2 MiB pool all on node 0: a hugetlb touch bound to node 1 is a SIGBUS.
    return Machine.x86_64(nodes=2, mem_per_node="64GiB", hugepages_per_node=[{"2MiB": 8}, {}])


def _probe(lib_path: str, kernel: object) -> dict[str, tuple[int, ...] | str]:
    lib = ctypes.CDLL(lib_path)
    lib.probe.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    capsule = capi.kernel_capsule(kernel)
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    buf = ctypes.create_string_buffer(8192)
    lib.probe(get(capsule, b"umbp_sim.kernel"), buf, len(buf))
    out: dict[str, tuple[int, ...] | str] = {}
    for line in buf.value.decode().splitlines():
        name, _, rest = line.partition(" ")
        out[name] = rest if name in ("crash", "reasons") else tuple(int(x) for x in rest.split())
    return out


def test_headers_and_interposer_ship_with_the_package() -> None:
    inc = Path(umbp_sim.capi.get_include())
    assert (inc / "umbp_sim" / "kernel.h").is_file()
    assert (inc / "umbp_sim" / "interposer.h").is_file()
    assert Path(capi.interposer_path()).is_file()
    assert umbp_sim.get_include() == capi.get_include()
    assert umbp_sim.interposer_path() == capi.interposer_path()


def test_capsule_round_trip_keeps_the_kernel() -> None:
    k = build_kernel(_machine())
    cap = capi.kernel_capsule(k)
    assert type(cap).__name__ == "PyCapsule"
    assert _native.KERNEL_CAPSULE == "umbp_sim.kernel"
    back = capi.kernel_from_capsule(cap)
    assert back.mappings() == k.mappings()
    with pytest.raises(TypeError, match="kernel must be a umbp_sim._native.Kernel"):
        capi.kernel_capsule(object())


def test_every_call_from_c_on_simkernel(capi_probe: str) -> None:
    stack = instrument(build_kernel(_machine()))
    r = _probe(capi_probe, stack.kernel)
    assert r["page_size"][0] == 4096
    assert r["flags"][0] == 1 | 2  # UMBP_SIM_KERNEL_SIMULATED | UMBP_SIM_KERNEL_CALL_SITES
    assert r["mmap"][1:] == (0, 0) and r["mmap"][0] % (2 << 20) == 0
    assert r["mapping_length"][0] == 4 << 20
    # The raw mask and maxnode reach the kernel unchanged: it reads maxnode-1 bits.
    assert r["mbind_node1_maxnode3"] == (0, 0, 0)
    assert r["mbind_node1_maxnode1"] == (-1, errno.EINVAL, 0)
    assert r["mbind_node63_maxnode64"] == (-1, errno.EINVAL, 0)
    assert r["read_meminfo"][0] > 0 and r["read_meminfo"][1] == 0
    assert r["read_missing"] == (-1, errno.ENOENT, 0)
    assert r["memfd_create"][0] >= 1000000
    assert r["ftruncate"] == (0, 0, 0)
    assert r["close"] == (0, 0, 0)
    assert r["close_again"] == (-1, errno.EBADF, 0)
    # Bound to node 1, whose pool is empty: populate fails, a touch is a SIGBUS.
    assert r["madvise_populate"] == (-1, errno.EFAULT, 0)
    assert r["touch"][2] == signal.SIGBUS
    assert r["crash"].startswith("SIGBUS in prefault touch (node 1, 2048 kB pages): no free")
    assert r["crash_text_length"][0] == len(r["crash"])
    # SimKernel's reasons (describe 2: JSON lines), as umbp_sim.sim.Reason holds them.
    reasons = [json.loads(line) for line in str(r["reasons"]).split("\x1f") if line]
    assert r["reasons_length"][0] == len(str(r["reasons"]))
    assert [Reason(**x).signal for x in reasons][-1] == "SIGBUS"
    assert {x["errno"] for x in reasons} >= {"EINVAL", "EFAULT"}
    assert all(isinstance(x["numbers"], dict) and x["rule"] and x["text"] for x in reasons)
    # The process is dead: every later call answers with the signal.
    assert r["munmap"][2] == signal.SIGBUS
    assert "mbind(" in "\n".join(t.text() for t in stack.tracing.records())


def test_injected_faults_and_the_real_kernel_through_c(capi_probe: str) -> None:
    plan = FaultPlan.from_rules([{"op": "mmap", "errno": "ENOMEM"}])
    r = _probe(capi_probe, plan.wrap(build_kernel(_machine())))
    assert r["mmap"] == (-1, errno.ENOMEM, 0)
    real = _probe(capi_probe, _native.LinuxKernel())
    assert real["flags"][0] == 2  # not simulated; UMBP_SIM_KERNEL_CALL_SITES
    assert real["mapping_length"][0] == 0  # unknown on the real kernel
    assert real["read_missing"] == (-1, errno.ENOENT, 0)
    assert real["reasons_length"][0] == 0 and real["reasons"] == ""  # not simulated


class _Result(ctypes.Structure):
    _fields_ = [("value", ctypes.c_long), ("error", ctypes.c_int), ("signal", ctypes.c_int)]


_SET_SITE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_ulong)
_CLOSE = ctypes.CFUNCTYPE(_Result, ctypes.c_void_p, ctypes.c_int)
# umbp_sim_kernel_ops (csrc/capi/umbp_sim/kernel.h): two unsigned, then the functions in order.
_OPS = ["page_size", "mmap", "munmap", "madvise", "mbind", "memfd_create", "ftruncate", "close",
        "read_file", "touch", "mapping_end", "describe", "retain", "release", "page_node",
        "set_call_site"]  # fmt: skip


def test_call_sites_are_recorded_once_each_and_bounded() -> None:
    """A call site set through the C ABI goes with the next call only, into the TracingKernel's
    table of distinct sites, which keeps at most 1024 (each one more is counted, its call
    records none)."""
    stack = instrument(build_kernel(_machine()))
    capsule = capi.kernel_capsule(stack.kernel)
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    handle = (ctypes.c_void_p * 2).from_address(get(capsule, b"umbp_sim.kernel"))
    ops_at, self_ = handle[0], handle[1]
    flags = ctypes.c_uint.from_address(ops_at + 4).value
    assert flags & 2  # UMBP_SIM_KERNEL_CALL_SITES
    fns = (ctypes.c_void_p * len(_OPS)).from_address(ops_at + 8)
    set_site = _SET_SITE(fns[_OPS.index("set_call_site")])
    close = _CLOSE(fns[_OPS.index("close")])
    close(self_, 7)  # no site set
    for i in range(1100):  # 1100 distinct sites in one object, then the first one again
        set_site(self_, b"/lib/x.so", 0x1000 + i)
        close(self_, 7)
    set_site(self_, b"/lib/x.so", 0x1000)
    close(self_, 7)
    close(self_, 7)  # the site went with the call before
    sites = stack.tracing.call_sites()
    assert len(sites) == 1024 and sites[0] == ("/lib/x.so", 0x1000)
    assert sites[-1] == ("/lib/x.so", 0x1000 + 1023)
    assert stack.tracing.sites_dropped == 1100 - 1024
    got = [r.site for r in stack.tracing.records()]
    assert got[0] == -1 and got[1:1025] == list(range(1024))
    assert got[1025:1101] == [-1] * 76 and got[1101:] == [0, -1]
