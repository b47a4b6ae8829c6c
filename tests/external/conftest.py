"""Builds of the test allocator (tests/external/tiny_allocator.cpp): a plain extension module
(run with the interposer preloaded) and `umbp-sim build-allocator` builds; and of the fake mori
checkout (tests/external/fake_mori) with its planted bugs. Each is compiled once and reused
while its inputs are unchanged (tests/build_cache.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from build_cache import cached_build, cached_builds

from umbp_sim.toolchain.mori_build import mori_build
from umbp_sim.toolchain.wrapped_build import compile_command, include_dirs

HERE = Path(__file__).resolve().parent
TINY_SOURCE = HERE / "tiny_allocator.cpp"
FAKE_MORI = HERE / "fake_mori"
# name -> the define that plants its bug (fake_mori's host_mem_allocator.cpp says what each does)
FAKE_MORI_VARIANTS = {
    "good": None,
    "refcount_bug": "FAKE_MORI_REFCOUNT_BUG",
    "requested_size": "FAKE_MORI_RECORDS_REQUESTED_SIZE",
    "no_fd": "FAKE_MORI_RECORDS_NO_FD",
    "reset": "FAKE_MORI_FREE_RESETS_HANDLE",
    "stale": "FAKE_MORI_STALE_FAILED_HANDLE",
    "leaky": "FAKE_MORI_LEAKS_FD",
}


@pytest.fixture(scope="session")
def tiny_builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """{"preload": path, "wrap": path} of the test allocator (compiled once: tests/build_cache)."""
    d = tmp_path_factory.mktemp("tiny")
    preload, wrapped = str(d / "tiny_umbp.so"), str(d / "tiny_wrapped.so")
    plain = ["c++", "-std=c++17", "-O1", "-fPIC", "-shared", "-DTINY_MODULE_NAME=tiny_umbp"]
    plain += [f"-I{i}" for i in include_dirs()] + [str(TINY_SOURCE), "-o", preload]
    wrap = compile_command([str(TINY_SOURCE)], wrapped, defines=["TINY_MODULE_NAME=tiny_wrapped"])
    return cached_builds({"preload": (plain, preload), "wrap": (wrap, wrapped)})


@pytest.fixture(scope="session")
def tiny_planted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Planted variants of the test allocator (link-time builds): {"wrong_node": binds to the
    other node of a pair, "env_probe": warns MORI_UMBP_LOG_LEVEL as getenv saw it at alloc
    (when set), "stride_bug": touches base pages by hand with the hugepage size as stride,
    "free_keeps_handle": a free whose munmap fails leaves the handle valid, "no_overflow_check",
    "size_32", "requested_rounded", "populate_read", "shm_private", "no_cloexec", "offset_32",
    "leak_fd", "mbind_error_level": tests/external/tiny_allocator.cpp says}."""
    d = tmp_path_factory.mktemp("tiny_planted")
    builds = {
        "wrong_node": "TINY_WRONG_NODE",
        "env_probe": "TINY_ENV_PROBE",
        "stride_bug": "TINY_STRIDE_BUG",
        "free_keeps_handle": "TINY_FREE_KEEPS_HANDLE",
        "no_overflow_check": "TINY_NO_OVERFLOW_CHECK",
        "size_32": "TINY_SIZE_32",
        "requested_rounded": "TINY_REQUESTED_ROUNDED",
        "populate_read": "TINY_POPULATE_READ",
        "shm_private": "TINY_SHM_PRIVATE",
        "no_cloexec": "TINY_NO_CLOEXEC",
        "offset_32": "TINY_OFFSET_32",
        "leak_fd": "TINY_LEAK_FD",
        "mbind_error_level": "TINY_MBIND_ERROR_LEVEL",
    }
    jobs = {}
    for name, define in builds.items():
        out = str(d / f"tiny_{name}.so")
        cmd = compile_command(
            [str(TINY_SOURCE)], out, defines=[f"TINY_MODULE_NAME=tiny_{name}", define]
        )
        jobs[name] = (cmd, out)
    return cached_builds(jobs)


@pytest.fixture(scope="session")
def capi_probe(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = str(tmp_path_factory.mktemp("capi") / "capi_probe.so")
    cmd = ["cc", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared"]
    cmd += [f"-I{include_dirs()[0]}", str(HERE / "capi_probe.c"), "-o", out]
    return cached_build(cmd, out)


@pytest.fixture(scope="session")
def no_userfaultfd(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A library to preload after the interposer: a host where userfaultfd does not work."""
    out = str(tmp_path_factory.mktemp("nouffd") / "no_userfaultfd.so")
    cmd = ["cc", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared"]
    cmd += [str(HERE / "no_userfaultfd.c"), "-o", out, "-ldl"]
    return cached_build(cmd, out)


@pytest.fixture(scope="session")
def mbind_probe(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A library whose probe_mbind() is syscall(SYS_mbind, ...) and returns the errno (0: ok)."""
    out = str(tmp_path_factory.mktemp("mbind") / "mbind_probe.so")
    cmd = ["cc", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared"]
    cmd += [str(HERE / "mbind_probe.c"), "-o", out]
    return cached_build(cmd, out)


@pytest.fixture(scope="session")
def probe(tmp_path_factory: pytest.TempPathFactory) -> str:
    """tests/external/exec_probe.c, built: a 2 MiB MAP_HUGETLB mapping bound to node 1."""
    out = str(tmp_path_factory.mktemp("exec") / "exec_probe")
    cmd = ["cc", "-std=gnu11", "-Wall", "-Wextra", "-Werror", str(HERE / "exec_probe.c"), "-o", out]
    return cached_build(cmd, out)


@pytest.fixture(scope="session")
def fake_mori_builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """{name: path} of ``build-allocator --mori tests/external/fake_mori [-D DEFINE]`` for each of
    FAKE_MORI_VARIANTS: build-allocator's own command (mori_build, compile_command), compiled
    once per set of inputs. What build-allocator adds around the compiler (the output checked,
    the module loaded before "built") is tested through the CLI in test_build_mori.py."""
    d = tmp_path_factory.mktemp("fake_mori")
    jobs = {}
    for name, define in FAKE_MORI_VARIANTS.items():
        out = str(d / f"mori_{name}.so")
        plan = mori_build(str(FAKE_MORI), out)
        defines = [*plan.defines, *([define] if define else [])]
        cmd = compile_command(plan.sources, out, plan.includes, defines, plan.extra)
        jobs[name] = (cmd, out)
    return cached_builds(jobs, inputs=[FAKE_MORI])
