"""Builds of the test allocator (tests/external/tiny_allocator.cpp), once per session: a plain
extension module (run with the interposer preloaded) and a `umbp-sim build-allocator` build."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from umbp_sim.external.build import compile_command, compiler_env, include_dirs

HERE = Path(__file__).resolve().parent
TINY_SOURCE = HERE / "tiny_allocator.cpp"


@pytest.fixture(scope="session")
def tiny_builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """{"preload": path, "wrap": path} of the test allocator, built in parallel."""
    d = tmp_path_factory.mktemp("tiny")
    preload, wrapped = d / "tiny_umbp.so", d / "tiny_wrapped.so"
    plain = ["c++", "-std=c++17", "-O1", "-fPIC", "-shared", "-DTINY_MODULE_NAME=tiny_umbp"]
    plain += [f"-I{i}" for i in include_dirs()] + [str(TINY_SOURCE), "-o", str(preload)]
    wrap = compile_command(
        [str(TINY_SOURCE)], str(wrapped), defines=["TINY_MODULE_NAME=tiny_wrapped"]
    )
    procs = [
        subprocess.Popen(c, stderr=subprocess.PIPE, text=True, env=compiler_env())
        for c in (plain, wrap)
    ]
    for p in procs:
        _, err = p.communicate()
        assert p.returncode == 0, err
    return {"preload": str(preload), "wrap": str(wrapped)}


@pytest.fixture(scope="session")
def tiny_planted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Planted variants of the test allocator (link-time builds): {"wrong_node": binds to the
    other node of a pair, "env_probe": warns MORI_UMBP_LOG_LEVEL as getenv saw it at alloc
    (when set)}."""
    d = tmp_path_factory.mktemp("tiny_planted")
    builds = {"wrong_node": "TINY_WRONG_NODE", "env_probe": "TINY_ENV_PROBE"}
    procs = []
    for name, define in builds.items():
        cmd = compile_command(
            [str(TINY_SOURCE)], str(d / f"tiny_{name}.so"),
            defines=[f"TINY_MODULE_NAME=tiny_{name}", define],
        )  # fmt: skip
        procs.append(subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=compiler_env()))
    for p in procs:
        _, err = p.communicate()
        assert p.returncode == 0, err
    return {name: str(d / f"tiny_{name}.so") for name in builds}


@pytest.fixture(scope="session")
def capi_probe(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("capi") / "capi_probe.so"
    cmd = ["cc", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared"]
    cmd += [f"-I{include_dirs()[0]}", str(HERE / "capi_probe.c"), "-o", str(out)]
    subprocess.run(cmd, check=True, env=compiler_env())
    return str(out)


@pytest.fixture(scope="session")
def no_userfaultfd(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A library to preload after the interposer: a host where userfaultfd does not work."""
    out = tmp_path_factory.mktemp("nouffd") / "no_userfaultfd.so"
    cmd = ["cc", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared"]
    cmd += [str(HERE / "no_userfaultfd.c"), "-o", str(out), "-ldl"]
    subprocess.run(cmd, check=True, env=compiler_env())
    return str(out)
