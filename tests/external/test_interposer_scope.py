"""The interposer routes only the allocator's calls, and its page traps stay bounded.

Each test runs a small Python program with the interposer preloaded (LD_PRELOAD), as
``umbp_sim.external.child`` does, and checks what it printed and how it ended.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

from umbp_sim.capi import interposer_path

PRELUDE = """
import ctypes, importlib.machinery, importlib.util, json, os, sys
from umbp_sim import Machine
from umbp_sim.external.interposer import Interposer
from umbp_sim.sim import build_kernel
from umbp_sim.trace import instrument

def load(path, name):
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))
    loader.exec_module(mod)
    return mod

ip = Interposer()
"""


def _run(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    # After what is preloaded already (the asan configuration preloads its runtime first).
    preload = (os.environ.get("LD_PRELOAD", "") + " " + interposer_path()).strip()
    env = dict(os.environ, LD_PRELOAD=preload)
    return subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code), *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_pythons_own_calls_are_never_intercepted() -> None:
    p = _run(
        """
        import mmap
        stack = instrument(build_kernel(Machine.x86_64(kernel_version="5.10.0")))
        ip.activate(stack.kernel)
        real = open("/proc/meminfo").read()
        with ip.scope():
            m = mmap.mmap(-1, 1 << 20)  # Python's mmap module: not a registered caller
            m[:5] = b"hello"
            ok = m[:5] == b"hello"
            m.close()
            page = os.sysconf("SC_PAGESIZE")
            fd = os.memfd_create("py")
            os.ftruncate(fd, 4096)
            os.close(fd)
        print(json.dumps({"ok": ok, "page": page, "calls": len(stack.tracing.records()),
                          "routed": ip.stats().routed, "meminfo_real": "MemTotal" in real,
                          "fd_real": fd < 1000000}))
        """
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {
        "ok": True, "page": 4096, "calls": 0, "routed": 0, "meminfo_real": True, "fd_real": True,
    }  # fmt: skip


def test_opens_of_proc_inside_the_scope_read_the_simulated_host() -> None:
    p = _run(
        """
        m = Machine.x86_64(hugepages={"2MiB": 777})
        stack = instrument(build_kernel(m))
        ip.activate(stack.kernel)
        with ip.scope():
            sim = open("/proc/meminfo").read()  # any caller on the thread inside the scope
            try:
                open("/proc/no-such-file")
                missing = "opened"
            except FileNotFoundError:
                missing = "ENOENT"
        real = open("/proc/meminfo").read()
        print(json.dumps([sim.count("HugePages_Total:     777"), missing,
                          real.count("HugePages_Total:     777")]))
        """
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == [1, "ENOENT", 0]


def test_a_simulated_fd_never_reaches_the_real_kernel(tiny_builds: dict[str, str]) -> None:
    p = _run(
        """
        mod = load(sys.argv[1], "tiny_umbp")
        ip.add_caller_object(sys.argv[1])
        kernel = build_kernel(Machine.x86_64())
        ip.activate(kernel)
        a = mod.UMBPHostMemAllocator()
        with ip.scope():
            h = a.alloc(1 << 20, mod.UMBPHostBufferBacking.AnonymousShm)
        fds = list(kernel.open_fds())
        os.close(fds[0])  # Python closes it, outside the scope: the simulator answers
        print(json.dumps([fds, list(kernel.open_fds()), ip.stats().sim_fds]))
        """,
        tiny_builds["preload"],
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == [[1000000], [], 0]


def test_simulated_sigbus_is_a_real_sigbus_after_the_trace(tiny_builds: dict[str, str]) -> None:
    p = _run(
        """
        import faulthandler
        faulthandler.enable()
        mod = load(sys.argv[1], "tiny_umbp")
        ip.add_caller_object(sys.argv[1])
        m = Machine.x86_64(nodes=2, hugepages_per_node=[{"2MiB": 8}, {}])
        stack = instrument(build_kernel(m))
        ip.activate(stack.kernel)
        a = mod.UMBPHostMemAllocator()
        with ip.scope():
            h = a.alloc(4 << 20, mod.UMBPHostBufferBacking.AnonymousHugetlb, numa_node=1,
                        prefault=False)
        print("allocated", flush=True)
        ctypes.memset(h.ptr, 1, 1)
        print("not reached", flush=True)
        """,
        tiny_builds["preload"],
    )
    assert p.returncode == -signal.SIGBUS
    assert p.stdout == "allocated\n"
    err = p.stderr
    assert err.index(
        "umbp-sim: simulated SIGBUS (page touch): SIGBUS in prefault touch (node 1)"
    ) < (err.index("umbp-sim: syscall trace:"))
    assert "touch(" in err and "+++ killed by SIGBUS +++" in err
    # Python's faulthandler (the handler before ours) printed the Python stack, as in the field.
    assert "Fatal Python error: Bus error" in err


def test_a_real_segfault_is_chained_to_the_previous_handler() -> None:
    p = _run(
        """
        import faulthandler
        faulthandler.enable()
        ip.activate(build_kernel(Machine.x86_64()))
        ctypes.string_at(16)
        """
    )
    assert p.returncode == -signal.SIGSEGV
    assert "Fatal Python error: Segmentation fault" in p.stderr
    assert "umbp-sim: simulated" not in p.stderr


def test_a_huge_page_by_page_touch_stays_bounded(tiny_builds: dict[str, str]) -> None:
    # 64 GiB of 4 KiB pages touched one by one on kernel 5.10 (no MADV_POPULATE_WRITE); the
    # 1.5 TiB figure is measured by bench/bench_interposer.py.
    p = _run(
        """
        mod = load(sys.argv[1], "tiny_umbp")
        ip.add_caller_object(sys.argv[1])
        kernel = build_kernel(Machine.x86_64(mem_per_node="128GiB", kernel_version="5.10.0"))
        ip.activate(kernel)
        rss = lambda: int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGESIZE")
        before = rss()
        a = mod.UMBPHostMemAllocator()
        with ip.scope():
            h = a.alloc(64 << 30, mod.UMBPHostBufferBacking.Anonymous)
        vmas = sum(1 for _ in open("/proc/self/maps"))
        print(json.dumps({"valid": bool(h), "faulted": kernel.mappings()[0]["faulted_pages"],
                          "rss_growth": rss() - before, "vmas": vmas,
                          "resident": ip.stats().resident}))
        """,
        tiny_builds["preload"],
    )
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["valid"] and r["faulted"] == (64 << 30) // 4096
    assert r["rss_growth"] < 64 << 20
    assert r["resident"] <= 48 << 20  # the default resident limit
    assert r["vmas"] < 1000


def test_an_abi_mismatch_is_refused() -> None:
    p = _run(
        """
        class K(ctypes.Structure):
            _fields_ = [("ops", ctypes.c_void_p), ("self", ctypes.c_void_p)]
        class Ops(ctypes.Structure):
            _fields_ = [("abi_version", ctypes.c_uint), ("flags", ctypes.c_uint)]
        ops = Ops(99, 0)
        k = K(ctypes.cast(ctypes.pointer(ops), ctypes.c_void_p), None)
        print(ip.lib.umbp_sim_interposer_activate(ctypes.byref(k)))
        """
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "22"  # EINVAL
