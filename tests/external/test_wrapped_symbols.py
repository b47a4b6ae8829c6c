"""build-allocator links a build with ``-Wl,--wrap=NAME`` for each name in
``umbp_sim.toolchain.wrapped_build.WRAPPED``: each needs the interposer library to define
``__wrap_NAME`` (or the link fails), and a ``__wrap_`` the library defines but no build is linked to
wrap is a call that escapes the seam in every ``--wrap`` build. The two lists are read here from the
library's dynamic symbol table, so neither can change alone."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from umbp_sim.capi import interposer_path
from umbp_sim.toolchain.wrapped_build import WRAPPED


def defined_wraps(library: str) -> set[str]:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm not found (binutils): cannot read the interposer's symbol table")
    proc = subprocess.run(
        [nm, "-D", "--defined-only", "--format=posix", library],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    names = (line.split()[0] for line in proc.stdout.splitlines() if line.strip())
    return {n.removeprefix("__wrap_") for n in names if n.startswith("__wrap_")}


def test_every_wrapped_name_is_defined_by_the_interposer_and_no_other() -> None:
    defined = defined_wraps(interposer_path())
    assert defined, "no __wrap_ symbol in the interposer library"
    assert sorted(set(WRAPPED) - defined) == []  # a build would not link
    assert sorted(defined - set(WRAPPED)) == []  # a --wrap build would call the real one
    assert len(WRAPPED) == len(set(WRAPPED))
