"""The interposer routes only the allocator's calls, and its page traps stay bounded.

Each test runs a small Python program with the interposer preloaded (LD_PRELOAD), as
``umbp_sim.external.child`` does, and checks what it printed and how it ended. Tests about
touching pages run under both fault paths (userfaultfd and PROT_NONE + SIGSEGV).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from umbp_sim.capi import interposer_path
from umbp_sim.external.evidence import Death, EvidenceReader
from umbp_sim.external.interposer import FAULT_PATH_ENV

FAULT_PATHS = pytest.mark.parametrize("fault_path", ["uffd", "sigsegv"])


def kernel_mode_userfaultfd() -> bool:
    """Whether this process may open a userfaultfd that also takes the faults of the kernel's
    own accesses (the interposer's first choices); otherwise it gets a user-mode-only one."""
    if os.geteuid() == 0:
        return True
    try:
        if Path("/proc/sys/vm/unprivileged_userfaultfd").read_text().strip() == "1":
            return True
    except OSError:
        pass
    return os.access("/dev/userfaultfd", os.R_OK | os.W_OK)


PRELUDE = """
import ctypes, importlib.machinery, importlib.util, json, os, sys
from umbp_sim import Machine
from umbp_sim.external.interposer import Interposer
from umbp_sim.sim import build_kernel
from umbp_sim.host.trace import instrument

def load(path, name):
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))
    loader.exec_module(mod)
    return mod

ip = Interposer()
"""


# The test allocator (argv[1]) on a 2-node Kernel whose 2 MiB pool is on node 0: `small`, 1 MiB
# anonymous, and `huge`, 4 MiB hugetlb bound to node 1 (no page there), neither touched yet.
SMALL_AND_HUGE = """
        mod = load(sys.argv[1], "tiny_umbp")
        ip.add_caller_object(sys.argv[1])
        kernel = build_kernel(Machine.x86_64(nodes=2, hugepages_per_node=[{"2MiB": 8}, {}]))
        ip.activate(kernel)
        a = mod.UMBPHostMemAllocator()
        with ip.scope():
            small = a.alloc(1 << 20, mod.UMBPHostBufferBacking.Anonymous, prefault=False)
            huge = a.alloc(4 << 20, mod.UMBPHostBufferBacking.AnonymousHugetlb, numa_node=1,
                           prefault=False)
"""


def _run(
    code: str,
    *args: str,
    fault_path: str = "auto",
    timeout: float = 120,
    preload_after: str = "",
    preload: bool = True,
) -> subprocess.CompletedProcess[str]:
    # After what is preloaded already (the asan configuration preloads its runtime first).
    ours = interposer_path() if preload else ""
    libs = " ".join([os.environ.get("LD_PRELOAD", ""), ours, preload_after])
    env = dict(os.environ, LD_PRELOAD=libs.strip(), **{FAULT_PATH_ENV: fault_path})
    return subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code), *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@FAULT_PATHS
def test_pythons_own_calls_are_never_intercepted(fault_path: str) -> None:
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
                          "fd_real": fd < 1000000, "path": ip.fault_path()}))
        """,
        fault_path=fault_path,
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {
        "ok": True, "page": 4096, "calls": 0, "routed": 0, "meminfo_real": True, "fd_real": True,
        "path": fault_path,
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


def test_opens_of_proc_the_host_does_not_render_are_this_boxs() -> None:
    """Inside the scope the simulated host answers the files it renders (a node it does not
    have is ENOENT); /proc/self/maps and /proc/cpuinfo are this box's, as the kernel answers
    them, not missing files."""
    p = _run(
        """
        stack = instrument(build_kernel(Machine.x86_64()))
        ip.activate(stack.kernel)
        real_cpus = open("/proc/cpuinfo").read().count("processor")
        with ip.scope():
            maps = open("/proc/self/maps").read()
            cpus = open("/proc/cpuinfo").read().count("processor")
            status = os.open("/proc/self/status", os.O_RDONLY)  # open(2), not only fopen
            own = os.read(status, 4096).decode()
            os.close(status)
            try:
                open("/sys/devices/system/node/node7/meminfo")
                node7 = "opened"
            except FileNotFoundError:
                node7 = "ENOENT"
        print(json.dumps(["[stack]" in maps, cpus == real_cpus > 0,
                          f"Pid:\t{os.getpid()}" in own, node7]))
        """
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == [True, True, True, "ENOENT"]


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


def _death(path: Path) -> Death | None:
    """The death the interposer wrote to the evidence file at ``path`` (None: nothing)."""
    reader = EvidenceReader()
    reader.feed(path.read_bytes())
    return reader.death


@FAULT_PATHS
def test_simulated_sigbus_is_a_real_sigbus_after_the_evidence(
    tiny_builds: dict[str, str], fault_path: str, tmp_path: Path
) -> None:
    """The evidence (crash record, reasons, trace) goes to the fd umbp-sim gave, made
    close-on-exec; stderr gets nothing of the interposer's; then the process dies of SIGBUS."""
    evidence = tmp_path / "evidence"
    p = _run(
        """
        import faulthandler
        faulthandler.enable()
        fd = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT)
        os.set_inheritable(fd, True)
        ip.set_evidence_fd(fd)
        print("inheritable", os.get_inheritable(fd), flush=True)
        mod = load(sys.argv[1], "tiny_umbp")
        ip.add_caller_object(sys.argv[1])
        m = Machine.x86_64(nodes=2, hugepages_per_node=[{"2MiB": 8}, {}])
        stack = instrument(build_kernel(m))
        ip.activate(stack.kernel)
        a = mod.UMBPHostMemAllocator()
        with ip.scope():
            h = a.alloc(4 << 20, mod.UMBPHostBufferBacking.AnonymousHugetlb, numa_node=1,
                        prefault=False)
        print("allocated", ip.fault_path(), flush=True)
        ctypes.memset(h.ptr, 1, 1)
        print("not reached", flush=True)
        """,
        tiny_builds["preload"],
        str(evidence),
        fault_path=fault_path,
    )
    assert p.returncode == -signal.SIGBUS
    assert p.stdout == f"inheritable False\nallocated {fault_path}\n"
    assert "umbp-sim" not in p.stderr
    # Python's faulthandler (the handler before ours) printed the Python stack, as in the field.
    assert "Fatal Python error: Bus error" in p.stderr
    death = _death(evidence)
    assert death is not None and death.crash is not None
    assert (death.signal, death.stage) == ("SIGBUS", "page touch")
    assert death.detail.startswith("SIGBUS in prefault touch (node 1, 2048 kB pages)")
    c = death.crash
    assert (c.signal, c.where, c.node, c.hugepage_size) == ("SIGBUS", "prefault touch", 1, 2 << 20)
    assert any(t.startswith("touch(") for t in death.trace)
    assert death.trace[-1].endswith("+++ killed by SIGBUS +++")
    # The Kernel's reasons, as the replay explains the death with them.
    assert "SIGBUS" in [r.signal for r in death.reasons]


def test_a_fork_dies_without_the_runs_evidence(tiny_builds: dict[str, str], tmp_path: Path) -> None:
    """A fork of the run's process closes its copy of the evidence fd: its death (a simulated
    SIGBUS) is neither written there nor printed; the run's own death still is."""
    evidence = tmp_path / "evidence"
    p = _run(
        """
        ip.set_evidence_fd(os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT))
        """
        + SMALL_AND_HUGE
        + """
        pid = os.fork()
        if pid == 0:
            ctypes.memset(huge.ptr, 1, 1)  # node 1 has no 2 MiB pages: SIGBUS
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        print(os.WTERMSIG(status) if os.WIFSIGNALED(status) else None, flush=True)
        print(os.path.getsize(sys.argv[2]), flush=True)
        ctypes.memset(huge.ptr, 1, 1)
        """,
        tiny_builds["preload"],
        str(evidence),
        fault_path="sigsegv",
    )
    assert p.returncode == -signal.SIGBUS
    assert p.stdout == f"{int(signal.SIGBUS)}\n0\n"
    assert "umbp-sim" not in p.stderr
    death = _death(evidence)
    assert death is not None and (death.signal, death.stage) == ("SIGBUS", "page touch")


@FAULT_PATHS
def test_a_real_segfault_is_chained_to_the_previous_handler(fault_path: str) -> None:
    p = _run(
        """
        import faulthandler
        faulthandler.enable()
        ip.activate(build_kernel(Machine.x86_64()))
        ctypes.string_at(16)
        """,
        fault_path=fault_path,
    )
    assert p.returncode == -signal.SIGSEGV
    assert "Fatal Python error: Segmentation fault" in p.stderr
    assert "umbp-sim: simulated" not in p.stderr


@FAULT_PATHS
def test_a_huge_page_by_page_touch_stays_bounded(
    tiny_builds: dict[str, str], fault_path: str
) -> None:
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
                          "resident": ip.stats().resident, "path": ip.fault_path(),
                          "traps": ip.stats().faults}))
        """,
        tiny_builds["preload"],
        fault_path=fault_path,
    )
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["path"] == fault_path
    assert r["valid"] and r["faulted"] == (64 << 30) // 4096
    assert r["traps"] < 2100  # 32 MiB blocks: 2048 of them, and the runs growing to the first
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


@FAULT_PATHS
def test_touched_pages_read_zero_and_keep_what_is_written(
    tiny_builds: dict[str, str], fault_path: str
) -> None:
    # A read first (the zero page on the userfaultfd path), then writes, on three pages.
    p = _run(
        """
        mod = load(sys.argv[1], "tiny_umbp")
        ip.add_caller_object(sys.argv[1])
        kernel = build_kernel(Machine.x86_64())
        ip.activate(kernel)
        a = mod.UMBPHostMemAllocator()
        with ip.scope():
            h = a.alloc(1 << 20, mod.UMBPHostBufferBacking.Anonymous, prefault=False)
        seen = []
        for off in (0, 8192, 1 << 19):
            seen.append(ctypes.string_at(h.ptr + off, 1)[0])
            ctypes.memset(h.ptr + off, 7, 4096)
            seen.append(ctypes.string_at(h.ptr + off + 4095, 1)[0])
        print(json.dumps([seen, kernel.mappings()[0]["faulted_pages"] > 0, ip.fault_path()]))
        """,
        tiny_builds["preload"],
        fault_path=fault_path,
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == [[0, 7, 0, 7, 0, 7], True, fault_path]


@FAULT_PATHS
def test_a_forked_child_still_touches_through_the_simulator(
    tiny_builds: dict[str, str], fault_path: str
) -> None:
    """After fork() the child's touches still reach the Kernel (its own copy): pages the parent
    was granted keep their contents, a new page is counted, and a touch the Kernel answers with
    SIGBUS kills the child. (A child of the userfaultfd path moves to the PROT_NONE path: its
    copies of registered mappings are not registered, and nobody would resolve them.)"""
    p = _run(
        SMALL_AND_HUGE
        + """
        ctypes.memset(small.ptr, 7, 4096)  # granted in the parent before the fork
        faulted = lambda: next(m["faulted_pages"] for m in kernel.mappings()
                               if m["start"] == small.ptr)
        before = faulted()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            kept = ctypes.string_at(small.ptr, 1)[0]
            ctypes.memset(small.ptr + (1 << 19), 9, 1)  # a page nobody touched yet
            seen = [kept, ctypes.string_at(small.ptr + (1 << 19), 1)[0], faulted() > before,
                    ip.fault_path()]
            os.write(w, json.dumps(seen).encode())
            os.close(w)
            ctypes.memset(huge.ptr, 1, 1)  # node 1 has no 2 MiB pages: SIGBUS
            os._exit(0)
        os.close(w)
        seen = json.loads(os.read(r, 4096))
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"child": seen, "child_signal": os.WTERMSIG(status)
                          if os.WIFSIGNALED(status) else None, "parent_faulted": faulted(),
                          "before": before, "path": ip.fault_path()}))
        """,
        tiny_builds["preload"],
        fault_path=fault_path,
    )
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["child"] == [7, 9, True, "sigsegv"]
    assert r["child_signal"] == signal.SIGBUS
    assert "umbp-sim: simulated SIGBUS (page touch)" in p.stderr
    assert r["parent_faulted"] == r["before"]  # the child's touches were its own Kernel's
    assert r["path"] == fault_path


@FAULT_PATHS
def test_a_syscall_into_an_untouched_page(tiny_builds: dict[str, str], fault_path: str) -> None:
    """read() into a simulated page nobody touched yet: the kernel's own access faults. On the
    userfaultfd path it reaches the Kernel like a user touch (the read succeeds, the page is
    counted), and a page the Kernel cannot give (no 2 MiB page on node 1) is EFAULT for the
    syscall, not a signal, as Linux answers a kernel-mode hugetlb fault. On the PROT_NONE path
    the kernel meets the protection: EFAULT (its known limit, README)."""
    if fault_path == "uffd" and not kernel_mode_userfaultfd():
        pytest.skip(
            "needs a userfaultfd that takes the kernel's own faults: root, "
            "vm.unprivileged_userfaultfd = 1 or access to /dev/userfaultfd"
        )
    p = _run(
        SMALL_AND_HUGE
        + """
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open("/dev/zero", os.O_RDONLY)
        out = []
        for buf in (small.ptr + 8192, huge.ptr):
            ctypes.set_errno(0)
            n = libc.read(fd, ctypes.c_void_p(buf), 4096)
            out.append([n, os.strerror(ctypes.get_errno()) if n < 0 else ""])
        faulted = next(m["faulted_pages"] for m in kernel.mappings() if m["start"] == small.ptr)
        print(json.dumps({"reads": out, "faulted": faulted, "path": ip.fault_path()}))
        """,
        tiny_builds["preload"],
        fault_path=fault_path,
    )
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["path"] == fault_path
    if fault_path == "uffd":
        assert r["reads"] == [[4096, ""], [-1, "Bad address"]]
        assert r["faulted"] >= 1
    else:
        assert r["reads"] == [[-1, "Bad address"], [-1, "Bad address"]]
        assert r["faulted"] == 0


ACTIVATE = """
from umbp_sim.external.interposer import FaultPathError
print(repr(ip.uffd_unavailable()))
try:
    ip.activate(build_kernel(Machine.x86_64()))
    print(ip.fault_path())
except FaultPathError as e:
    print(e)
"""


def test_userfaultfd_works_here_as_ci_runs() -> None:
    # CI runs as root on a kernel with userfaultfd: the default is the userfaultfd path.
    p = _run(ACTIVATE)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["''", "uffd"]


def test_without_userfaultfd_auto_is_sigsegv_and_uffd_is_one_error(no_userfaultfd: str) -> None:
    auto = _run(ACTIVATE, preload_after=no_userfaultfd)
    assert auto.returncode == 0, auto.stderr
    why = "userfaultfd(2): Function not implemented; /dev/userfaultfd: No such file or directory"
    assert auto.stdout.splitlines() == [repr(why), "sigsegv"]
    forced = _run(ACTIVATE, fault_path="uffd", preload_after=no_userfaultfd)
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.splitlines()[1:] == [
        f"UMBP_SIM_FAULT_PATH=uffd: userfaultfd does not work here ({why})"
    ]
    bad = _run(ACTIVATE, fault_path="mprotect")
    assert bad.stdout.splitlines()[1:] == [
        "UMBP_SIM_FAULT_PATH=mprotect: expected uffd, sigsegv or auto"
    ]


def test_an_allocator_server_without_userfaultfd_could_not_run(
    tiny_builds: dict[str, str], no_userfaultfd: str
) -> None:
    from umbp_sim.allocator_spec import parse_allocator_spec
    from umbp_sim.external.runner import CouldNotRun
    from umbp_sim.run_router import open_allocator

    preload = " ".join([os.environ.get("LD_PRELOAD", ""), interposer_path(), no_userfaultfd])
    env = {FAULT_PATH_ENV: "uffd", "LD_PRELOAD": preload.strip()}
    with pytest.raises(CouldNotRun) as e:
        open_allocator(parse_allocator_spec(tiny_builds["preload"]), env=env)
    assert str(e.value).endswith(
        ": UMBP_SIM_FAULT_PATH=uffd: userfaultfd does not work here (userfaultfd(2): Function not"
        " implemented; /dev/userfaultfd: No such file or directory)"
    )


@pytest.mark.threads
def test_the_resolver_thread_serves_a_wrapped_build(tiny_builds: dict[str, str]) -> None:
    # The userfaultfd path's resolver thread, with the interposer linked into the allocator
    # (--wrap) rather than preloaded: `tox -e tsan` runs this one (a TSan-built interposer cannot
    # be preloaded into Python), faults from the allocator's prefault and from Python's writes.
    p = _run(
        """
        mod = load(sys.argv[1], "tiny_wrapped")
        kernel = build_kernel(Machine.x86_64(mem_per_node="64GiB", kernel_version="5.10.0"))
        ip.activate(kernel)
        a = mod.UMBPHostMemAllocator()
        with ip.scope():
            big = a.alloc(8 << 30, mod.UMBPHostBufferBacking.Anonymous)
            small = a.alloc(1 << 20, mod.UMBPHostBufferBacking.Anonymous, prefault=False)
        seen = []
        for off in (0, 8192, 1 << 19):
            seen.append(ctypes.string_at(small.ptr + off, 1)[0])
            ctypes.memset(small.ptr + off, 7, 4096)
            seen.append(ctypes.string_at(small.ptr + off + 4095, 1)[0])
        faulted = sorted(m["faulted_pages"] for m in kernel.mappings())
        with ip.scope():
            a.free(small)
            a.free(big)
        stats = ip.stats()
        print(json.dumps([ip.fault_path(), seen, faulted, stats.moved > 0, stats.mappings]))
        ip.deactivate()
        """,
        tiny_builds["wrap"],
        fault_path="uffd",
        preload=False,
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == ["uffd", [0, 7, 0, 7, 0, 7], [3, (8 << 30) // 4096], True, 0]


def test_bad_mbind_arguments_are_errnos_as_on_linux(mbind_probe: str) -> None:
    """A huge maxnode is EINVAL, a nodemask that cannot be read EFAULT (Linux's get_nodes;
    docs/kernel-model.md section 3), as they are for the Kernel itself, never a SIGSEGV of the
    process, also with a traced and fault-injecting Kernel that formats the mask."""
    p = _run(
        """
        import errno, mmap
        from umbp_sim.faults import FaultPlan
        lib = ctypes.CDLL(sys.argv[1])
        lib.probe_mbind.argtypes = [ctypes.c_void_p, ctypes.c_ulong, ctypes.c_int,
                                    ctypes.c_void_p, ctypes.c_ulong, ctypes.c_uint]
        ip.add_caller_object(sys.argv[1])
        m = Machine.x86_64(nodes=2)
        plan = FaultPlan.from_rules([{"op": "mbind", "errno": "EIO", "nth": 1000}])
        sim = build_kernel(m)
        stack = instrument(sim, plan)
        ip.activate(stack.kernel)
        addr = stack.kernel.mmap(0, 1 << 20, 3, 0x22).value
        # One word of mask on the last 8 bytes before a page that is not mapped.
        guard = mmap.mmap(-1, 2 * 4096)
        base = ctypes.addressof(ctypes.c_char.from_buffer(guard))
        tail = base + 4096 - 8
        ctypes.c_ulong.from_address(tail).value = 1 << 1
        ctypes.CDLL(None).mprotect(ctypes.c_void_p(base + 4096), 4096, 0)
        word = (ctypes.c_ulong * 1)(1 << 1)
        cases = {
            "node1": (word, 3),
            "maxnode_2_64": (word, 1 << 64 - 1),
            "maxnode_max": (word, (1 << 64) - 1),
            "maxnode_32770": (word, 32770),
            "maxnode_32769_one_word": (tail, 32769),
            "mask_16": (16, 3),
            "mask_unmapped_page": (base + 4096, 65),
            "mask_null_empty_bind": (None, 3),
            "maxnode_0": (word, 0),
        }
        out = {}
        with ip.scope():
            for name, (mask, maxnode) in cases.items():
                rc = lib.probe_mbind(addr, 1 << 20, 2, mask, maxnode, 0)  # MPOL_BIND
                out[name] = errno.errorcode.get(rc, rc)
            rc = lib.probe_mbind(addr, 1 << 20, 99, 16, 3, 0)  # a bad mode is checked first
            out["bad_mode_and_mask"] = errno.errorcode.get(rc, rc)
        lines = [r.text() for r in stack.tracing.records() if "mbind" in r.text()]
        out["traced"] = len(lines)
        out["trace_mask_16"] = [x.split(", ", 3)[3] for x in lines if ", 0x10, 3, " in x]
        out["reasons"] = [r["text"] for r in sim.reasons() if r["rule"] == "mbind_mask_unreadable"]
        print(json.dumps(out))
        """,
        mbind_probe,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout)
    reasons = out.pop("reasons")
    assert len(reasons) == 3
    assert re.fullmatch(
        r"the nodemask at 0x[0-9a-f]+ cannot be read \(maxnode 32769: 4096 bytes\): mbind fails "
        r"with EFAULT",
        reasons[0],
    ), reasons[0]
    assert out == {
        "node1": 0,
        "maxnode_2_64": "EINVAL",
        "maxnode_max": "EINVAL",
        "maxnode_32770": "EINVAL",
        "maxnode_32769_one_word": "EFAULT",
        "mask_16": "EFAULT",
        "mask_unmapped_page": "EFAULT",
        "mask_null_empty_bind": "EINVAL",
        "maxnode_0": "EINVAL",
        "bad_mode_and_mask": "EINVAL",
        "traced": 10,
        "trace_mask_16": [  # the mask's address, as strace shows one it cannot read
            "0x10, 3, 0) = -1 EFAULT (Bad address)",
            "0x10, 3, 0) = -1 EINVAL (Invalid argument)",
        ],
    }
