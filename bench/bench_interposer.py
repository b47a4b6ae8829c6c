"""Issue 14: the interposer and external allocators.

1. Interposer loaded (LD_PRELOAD) but inactive: Python's own mmap+munmap, vs the same program
   without it (target <= 1.05x); and with a kernel active (Python's calls are not the
   allocator's, so they stay real).
2. An external allocator (tests/external/tiny_allocator.cpp, preloaded) on SimKernel, 4 KiB
   alloc+free per second, and the built-in allocator's rate on the same SimKernel in the same
   process (target: external time <= 3x built-in).
3. A simulated 1.5 TiB buffer (kernel 5.10: no MADV_POPULATE_WRITE, 4 KiB pages) touched page by
   page through the page traps, on both fault paths side by side (userfaultfd with its resolver
   thread, PROT_NONE + SIGSEGV): wall and CPU seconds (target < 10 s), traps, RSS growth
   (< 64 MiB), real VMAs afterwards.

Each figure runs in child processes (the interposer must be preloaded); rounds alternate the
variants. ``--quick``: short rounds and a 64 GiB touch.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import BUILD, ROOT, emit, figure, ratios, unavailable  # noqa: E402

TINY = ROOT / "tests" / "external" / "tiny_allocator.cpp"

MMAP_LOOP = """
import mmap, sys, time
n = int(sys.argv[1])
if sys.argv[2] == "active":
    from umbp_sim import Machine
    from umbp_sim.external.interposer import Interposer
    from umbp_sim.sim import build_kernel
    ip = Interposer(); ip.activate(build_kernel(Machine.x86_64()))
for _ in range(n // 10):  # warm-up
    mmap.mmap(-1, 4096).close()
t = time.perf_counter()
for _ in range(n):
    mmap.mmap(-1, 4096).close()
print((time.perf_counter() - t) / n * 1e9)
"""

ALLOC_RATE = """
import importlib.machinery, importlib.util, sys, time
from umbp_sim import Machine, UMBPHostMemAllocator, Anonymous
from umbp_sim.external.interposer import Interposer
from umbp_sim.sim import build_kernel
path, n, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
loader = importlib.machinery.ExtensionFileLoader("tiny_umbp", path)
mod = importlib.util.module_from_spec(importlib.util.spec_from_loader("tiny_umbp", loader))
loader.exec_module(mod)
ip = Interposer(); ip.add_caller_object(path)
kernel = build_kernel(Machine.x86_64())
ip.activate(kernel)
ext, B = mod.UMBPHostMemAllocator(), mod.UMBPHostBufferBacking.Anonymous
builtin = UMBPHostMemAllocator(kernel=kernel)
def run_ext():
    t = time.perf_counter()
    with ip.scope():
        for _ in range(n):
            ext.free(ext.alloc(4096, B))
    return n / (time.perf_counter() - t)
def run_builtin():
    t = time.perf_counter()
    for _ in range(n):
        builtin.free(builtin.alloc(4096, Anonymous))
    return n / (time.perf_counter() - t)
run_ext(); run_builtin()
out = {"ext": [], "builtin": []}
for _ in range(rounds):
    out["ext"].append(run_ext()); out["builtin"].append(run_builtin())
assert not kernel.mappings(), "leaked simulated mappings"
import json; print(json.dumps(out))
"""

TOUCH = """
import importlib.machinery, importlib.util, json, os, resource, sys, time
from umbp_sim import Machine
from umbp_sim.external.interposer import Interposer
from umbp_sim.sim import build_kernel
path, gib = sys.argv[1], int(sys.argv[2])
loader = importlib.machinery.ExtensionFileLoader("tiny_umbp", path)
mod = importlib.util.module_from_spec(importlib.util.spec_from_loader("tiny_umbp", loader))
loader.exec_module(mod)
ip = Interposer(); ip.add_caller_object(path)
kernel = build_kernel(Machine.x86_64(mem_per_node="2TiB", kernel_version="5.10.0"))
ip.activate(kernel, fault_path=sys.argv[3])
a = mod.UMBPHostMemAllocator()
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGESIZE")
before = rss()
cpu0 = resource.getrusage(resource.RUSAGE_SELF)
t = time.perf_counter()
with ip.scope():
    h = a.alloc(gib << 30, mod.UMBPHostBufferBacking.Anonymous)
wall = time.perf_counter() - t
cpu1 = resource.getrusage(resource.RUSAGE_SELF)
pages = kernel.mappings()[0]["faulted_pages"]
print(json.dumps({"valid": bool(h), "wall": wall,
                  "cpu": cpu1.ru_utime - cpu0.ru_utime + cpu1.ru_stime - cpu0.ru_stime,
                  "rss_growth": rss() - before, "vmas": sum(1 for _ in open("/proc/self/maps")),
                  "pages": pages, "faults": ip.stats().faults, "path": ip.fault_path()}))
"""


def _py(code: str, *args: str, preload: bool = True) -> str:
    from umbp_sim.capi import interposer_path

    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if preload:
        env["LD_PRELOAD"] = interposer_path()
    p = subprocess.run(
        [sys.executable, "-P", "-c", textwrap.dedent(code), *args],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if p.returncode != 0:
        raise RuntimeError(f"bench child failed ({p.returncode}): {p.stderr.strip()[-500:]}")
    return p.stdout


def build_tiny() -> Path:
    from umbp_sim.toolchain.wrapped_build import include_dirs

    h = hashlib.sha256(TINY.read_bytes()).hexdigest()[:12]
    out = BUILD / f"tiny_umbp-{h}.so"
    if not out.exists():
        BUILD.mkdir(parents=True, exist_ok=True)
        cmd = ["c++", "-std=c++17", "-O2", "-fPIC", "-shared", "-DTINY_MODULE_NAME=tiny_umbp"]
        cmd += [f"-I{d}" for d in include_dirs()] + [str(TINY), "-o", str(out) + ".tmp"]
        print(f"bench: building {out.name} ...", file=sys.stderr, flush=True)
        subprocess.run(cmd, check=True)
        os.replace(str(out) + ".tmp", out)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    quick = "--quick" in argv
    try:
        import umbp_sim.capi  # noqa: F401
    except ImportError as e:
        why = f"umbp_sim.capi not importable ({e})"
        return {"bench": "interposer", "figures": [unavailable("interposer", why)]}
    rounds, n = (3, 20000) if quick else (9, 100000)
    bare, inactive, active = [], [], []
    for _ in range(rounds):
        bare.append(float(_py(MMAP_LOOP, str(n), "none", preload=False)))
        inactive.append(float(_py(MMAP_LOOP, str(n), "none")))
        active.append(float(_py(MMAP_LOOP, str(n), "active")))
    figs = [
        figure(
            "Python mmap+munmap 4 KiB, interposer loaded inactive / not loaded",
            ratios(inactive, bare),
            target="<= 1.05",
            note=f"{sorted(bare)[len(bare) // 2]:.0f} ns/pair without",
        ),
        figure(
            "Python mmap+munmap 4 KiB, interposer active (not the allocator's) / not loaded",
            ratios(active, bare),
        ),
    ]
    tiny = build_tiny()
    rates = json.loads(_py(ALLOC_RATE, str(tiny), str(2000 if quick else 20000), str(rounds)))
    figs += [
        figure("external allocator alloc+free/s 4 KiB on SimKernel (preload)", rates["ext"], "1/s"),
        figure(
            "built-in allocator alloc+free/s 4 KiB on the same SimKernel", rates["builtin"], "1/s"
        ),
        figure(
            "external / built-in time per 4 KiB alloc+free on SimKernel",
            ratios(rates["builtin"], rates["ext"]),
            target="<= 3",
        ),
    ]
    gib = 64 if quick else 1536
    label = f"{gib} GiB" if gib < 1024 else f"{gib / 1024:g} TiB"
    touches: dict[str, Any] = {}
    for path in ("uffd", "sigsegv"):  # one after the other, in the same run
        t = json.loads(_py(TOUCH, str(tiny), str(gib), path))
        assert t["valid"] and t["path"] == path and t["pages"] == (gib << 30) // 4096, t
        touches[path] = t
    for path, t in touches.items():
        name = {"uffd": "userfaultfd", "sigsegv": "PROT_NONE+SIGSEGV"}[path]
        figs += [
            figure(
                f"{label} simulated buffer touched page by page (5.10, 4 KiB), {name}: wall",
                [t["wall"]],
                "s",
                target="< 10",
                note=f"{t['faults']} traps, {t['pages']} pages; CPU {t['cpu']:.1f} s",
            ),
            figure(f"{label} touch, {name}: CPU seconds (user+sys)", [t["cpu"]], "s", "< 10"),
            figure(f"{label} touch, {name}: RSS growth", [t["rss_growth"] / 2**20], "MiB", "< 64"),
            figure(f"{label} touch, {name}: real VMAs afterwards", [t["vmas"]], "", None),
        ]
    figs.append(
        figure(
            f"{label} touch: CPU userfaultfd / PROT_NONE+SIGSEGV",
            [touches["uffd"]["cpu"] / touches["sigsegv"]["cpu"]],
        )
    )
    return {"bench": "interposer", "figures": figs, "touch": touches, "rates": rates}


if __name__ == "__main__":
    emit(main(), sys.argv[1:])
