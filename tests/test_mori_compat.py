"""umbp_sim.mori_compat: ``import mori.umbp`` resolves to umbp-sim inside the block only."""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

import pytest

from umbp_sim.mori_compat import mori_umbp

TESTS = Path(__file__).parent


def fake_source() -> types.SimpleNamespace:
    class UMBPHostMemAllocator:
        pass

    class UMBPHostBufferBacking:
        Anonymous = 0

    return types.SimpleNamespace(
        __name__="fake",
        UMBPHostMemAllocator=UMBPHostMemAllocator,
        UMBPHostBufferBacking=UMBPHostBufferBacking,
    )


def mori_entries() -> dict[str, object]:
    return {k: v for k, v in sys.modules.items() if k == "mori" or k.startswith("mori.")}


def test_import_resolves_inside_and_is_gone_after() -> None:
    src = fake_source()
    assert mori_entries() == {}
    with mori_umbp(src) as umbp:
        import mori.umbp
        from mori.umbp import UMBPHostBufferBacking, UMBPHostMemAllocator

        assert mori.umbp is umbp
        assert UMBPHostMemAllocator is src.UMBPHostMemAllocator
        assert UMBPHostBufferBacking is src.UMBPHostBufferBacking
        import mori.umbp as m2

        assert m2 is umbp
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module("mori.io")  # the stand-in has only umbp
    assert mori_entries() == {}
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("mori.umbp")


def test_restores_an_imported_mori_exactly_even_on_error() -> None:
    real = types.ModuleType("mori")
    real.__path__ = []
    real_umbp = types.ModuleType("mori.umbp")
    real_io = types.ModuleType("mori.io")
    real.umbp = real_umbp
    saved = dict(sys.modules)
    sys.modules.update({"mori": real, "mori.umbp": real_umbp, "mori.io": real_io})
    try:
        before = dict(sys.modules)
        with pytest.raises(KeyError, match="boom"):
            with mori_umbp(fake_source()) as umbp:
                import mori.umbp

                assert mori.umbp is umbp is not real_umbp
                assert "mori.io" not in sys.modules
                raise KeyError("boom")
        assert dict(sys.modules) == before
        assert all(sys.modules[k] is v for k, v in before.items())
        assert real.umbp is real_umbp  # the real package object was never touched
    finally:
        sys.modules.clear()
        sys.modules.update(saved)


def test_installed_but_not_imported_mori(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "mori"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "umbp.py").write_text("REAL = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with mori_umbp(fake_source()):
        import mori.umbp

        assert not hasattr(mori.umbp, "REAL")
    assert mori_entries() == {}
    try:
        real = importlib.import_module("mori.umbp")
        assert real.REAL is True
    finally:
        for k in list(mori_entries()):
            del sys.modules[k]


def test_nested_blocks() -> None:
    a, b = fake_source(), fake_source()
    with mori_umbp(a):
        with mori_umbp(b):
            from mori.umbp import UMBPHostMemAllocator

            assert UMBPHostMemAllocator is b.UMBPHostMemAllocator
        from mori.umbp import UMBPHostMemAllocator as again

        assert again is a.UMBPHostMemAllocator
    assert mori_entries() == {}


def test_caller_module_binds_inside_and_is_forgotten_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(TESTS))
    src = fake_source()
    with mori_umbp(src) as umbp:
        caller = importlib.import_module("mori_caller")
        assert caller.umbp is umbp
        assert caller.UMBPHostMemAllocator is src.UMBPHostMemAllocator
    assert "mori_caller" not in sys.modules
    assert mori_entries() == {}


def test_source_without_the_surface_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match=r"^mori_compat: 'empty' has no UMBPHostMemAllocator, "):
        with mori_umbp(types.SimpleNamespace(__name__="empty")):
            pass
    assert mori_entries() == {}
