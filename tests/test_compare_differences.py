"""compare's classes of difference between two outcomes
(umbp_sim.comparison.differences.differences), on outcomes built by hand: no allocator runs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from umbp_sim.comparison.differences import differences
from umbp_sim.engine.record import RunRecord


def _ok(backing: str, binding: str, mapped: int = 4 << 20) -> RunRecord:
    handle = {"valid": True, "ptr": 0x7F0000000000, "requested_size": 4 << 20,
              "mapped_size": mapped, "backing": backing, "alignment": 2 << 20}  # fmt: skip
    return RunRecord("ok", handle=handle, binding=binding)


def test_same_backing_compares_policy_and_pages() -> None:
    a = _ok("AnonymousHugetlb", "bind 0; hugepages 2 x 2MiB on node 0")
    b = _ok("AnonymousHugetlb", "bind 1; hugepages 2 x 2MiB on node 1")
    assert differences(a, b) == {"numa binding": (a.binding, b.binding)}
    c = _ok("AnonymousHugetlb", "bind 0; hugepages 1 x 2MiB on node 0, 1 x 2MiB on node 1")
    assert set(differences(a, c)) == {"numa binding"}
    assert differences(a, _ok("AnonymousHugetlb", a.binding or "")) == {}


def test_other_backing_compares_the_policy_only() -> None:
    """A demoted buffer has no hugepages: that follows from the backing, which is its own class;
    its policy is still compared."""
    hp = _ok("AnonymousHugetlb", "bind 1; hugepages 2 x 2MiB on node 1")
    small = _ok("Anonymous", "bind 1")
    assert set(differences(hp, small)) == {"backing"}
    unbound = _ok("Anonymous", "default")
    got = differences(hp, unbound)
    assert set(got) == {"backing", "numa binding"}
    assert got["numa binding"] == ("bind 1; hugepages 2 x 2MiB on node 1", "default")


def test_the_size_a_handle_says_was_asked_for() -> None:
    """A handle that reports its rounded size as the requested one (a planted bug compare did
    not see while it compared backing, mapped size and alignment only)."""
    a = _ok("AnonymousHugetlb", "default")
    b = _ok("AnonymousHugetlb", "default")
    assert b.handle is not None
    b.handle["requested_size"] = 6 << 20
    assert differences(a, b) == {"requested_size": (4 << 20, 6 << 20)}


def test_compare_help_names_every_class() -> None:
    import argparse

    from umbp_sim.commands import compare as command
    from umbp_sim.comparison.differences import CLASSES

    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    epilog = " ".join((parser.epilog or "").split())
    assert [c for c in CLASSES if c not in epilog] == []


def test_the_registry_is_compared_where_both_runs_asked_it_to_the_same_end() -> None:
    """The shm registry's answers ("found N; after free none") differ in class "registry" when
    both runs came to the same outcome with the same backing and both builds have the registry
    (None: not asked); a free that crashed on one side has no after-free answer there, which
    "outcome" says, not "registry"."""
    a, b = _ok("AnonymousShm", "default"), _ok("AnonymousShm", "default")
    a.registry, b.registry = "found 4194304; after free none", "none; after free none"
    assert differences(a, b) == {"registry": (a.registry, b.registry)}
    b.registry = None  # a build without the registry's calls
    assert differences(a, b) == {}
    died = RunRecord("crashed", signal="SIGSEGV", stage="free", registry="found 4194304")
    assert set(differences(a, died)) == {"outcome"}
    demoted = _ok("Anonymous", "default")
    demoted.registry = "none; after free none"
    assert set(differences(a, demoted)) == {"backing"}


def test_a_run_records_every_field_of_the_handle_after_alloc_and_after_free() -> None:
    """issue 41: what alloc returned and what the first Free left of it, every field the
    binding's handle has (identities, whose values differ from process to process, as set or
    their null value); Free clears ptr, the sizes, fd and serial and keeps the rest."""
    from umbp_sim import _native
    from umbp_sim.comparison.matrix import _life, machine
    from umbp_sim.engine.spec import Run
    from umbp_sim.request import AllocRequest
    from umbp_sim.run_router import run

    fields = [n for n, v in vars(_native.UMBPHostBufferHandle).items() if isinstance(v, property)]
    call = AllocRequest(4 << 20, "AnonymousShm", numa_node=1)
    rec = run(Run(machine("ample"), _life(call), allocator="umbp-sim"))
    assert rec.handle_after_alloc is not None and rec.after_free is not None
    assert list(rec.handle_after_alloc) == ["valid", *fields] == list(rec.after_free)
    assert rec.handle_after_alloc == {
        "valid": True, "ptr": "set", "requested_size": 4 << 20, "mapped_size": 4 << 20,
        "actual_backing": "AnonymousShm", "actual_alignment": 4096, "fd": "set", "numa_node": 1,
        "serial": "set", "kernel_id": "set",
    }  # fmt: skip
    assert rec.after_free == rec.handle_after_alloc | {
        "valid": False, "ptr": 0, "requested_size": 0, "mapped_size": 0, "fd": -1, "serial": 0,
    }  # fmt: skip


def _fields(**changes: object) -> dict[str, object]:
    base = {"valid": True, "ptr": "set", "requested_size": 4 << 20, "mapped_size": 4 << 20,
            "actual_backing": "AnonymousShm", "actual_alignment": 4096,
            "numa_node": -1}  # fmt: skip
    return base | changes


def test_the_handle_is_compared_field_by_field_after_alloc_and_after_free() -> None:
    """A Free that resets the whole handle differs in "after free" by the fields it lost; a
    field that differed already after alloc is said there, not again after free; a field one
    build's handle lacks is not compared; a valid handle's backing and sizes keep their own
    classes ("handle" holds the other fields), an invalid handle's are all in "handle"."""
    a, b = _ok("AnonymousShm", "default"), _ok("AnonymousShm", "default")
    a.handle_after_alloc = b.handle_after_alloc = _fields()
    freed = _fields(valid=False, ptr=0, requested_size=0, mapped_size=0)
    a.after_free = freed
    b.after_free = freed | {"actual_backing": "Anonymous", "actual_alignment": 0}
    assert differences(a, b) == {
        "after free": (
            {"actual_backing": "AnonymousShm", "actual_alignment": 4096},
            {"actual_backing": "Anonymous", "actual_alignment": 0},
        )
    }
    b.handle_after_alloc = _fields(numa_node=1)
    b.after_free = freed | {"numa_node": 1, "fd": "set"}  # fd: a field only B's handle has
    assert differences(a, b) == {"handle": ({"numa_node": -1}, {"numa_node": 1})}
    bad, stale = RunRecord("failed", failure="invalid"), RunRecord("failed", failure="invalid")
    invalid = {"valid": False, "ptr": 0, "requested_size": 0, "mapped_size": 0,
               "actual_backing": "Anonymous", "actual_alignment": 0}  # fmt: skip
    bad.handle_after_alloc, bad.after_free = invalid, invalid
    stale.handle_after_alloc = stale.after_free = invalid | {"actual_alignment": 4096}
    assert differences(bad, stale) == {
        "handle": ({"actual_alignment": 0}, {"actual_alignment": 4096})
    }


def test_the_quick_matrix_fails_frees_own_munmap_and_close() -> None:
    """issue 41: the quick matrix's injected munmap and close errors land on Free's own calls
    (the buffer's whole range, its memfd after that range is unmapped), on both built-in
    allocators and every backing that makes the call."""
    from umbp_sim.allocator_spec import AllocatorSpec
    from umbp_sim.comparison import matrix
    from umbp_sim.run_router import BuiltinAllocator

    hit: dict[str, set[str]] = {"munmap": set(), "close": set()}
    for profile in ("umbp-sim", "mori-624002c"):
        opened = BuiltinAllocator(AllocatorSpec("builtin", profile))
        for r in matrix.quick():
            op = r.label.split("] ")[0].split(" ")[-1].split(":")[0]
            if op not in hit:
                continue
            rec = opened.run(r)
            assert rec.handle is not None and rec.handle["valid"], r.label
            unmap = f"munmap({rec.handle['ptr']:#x}, {rec.handle['mapped_size']}) = "
            injected = [i for i, t in enumerate(rec.trace) if t.endswith("(injected)")]
            if op == "munmap":
                assert [rec.trace[i] for i in injected] == [unmap + "-1 EINVAL (injected)"]
            elif injected:
                (i,) = injected
                assert rec.trace[i - 1] == unmap + "0" and rec.trace[i].startswith("close(")
            else:  # a buffer without an fd: no close to fail
                assert rec.handle["backing"] in ("Anonymous", "AnonymousHugetlb"), r.label
                continue
            hit[op].add(f"{profile} {rec.handle['backing']}")
    assert len(hit["munmap"]) == 8 and len(hit["close"]) == 4, hit


def test_runs_in_a_row_timed_out_in_one_stage_on_one_side_stop() -> None:
    """Three runs in a row of one allocator timed out in the same stage stop the comparison
    (``Stalled``, one line); another stage, the other side or a run between starts again."""
    import pytest

    from umbp_sim.comparison.differences import Stalled, stop_when_stalled

    def items(*stalls: tuple[str | None, str | None]) -> Iterator[Any]:
        yield from ((None, {}, "", "", s) for s in stalls)

    a, b, alloc_b, free_b, free_a = (
        ("alloc", None),
        (None, "alloc"),
        ("x", "alloc"),
        (None, "free"),
        ("free", None),
    )
    ok = (None, None)
    fine = items(a, a, ok, a, a, free_a, a, b, b, free_b, alloc_b)
    assert len(list(stop_when_stalled(fine, ("A", "B"), 11, 60.0))) == 11
    stalled = stop_when_stalled(items(ok, b, alloc_b, b, ok), ("A", "B"), 5, 60.0)
    with pytest.raises(Stalled) as e:
        list(stalled)
    assert str(e.value) == (
        "B: 3 runs in a row timed out after 60 s in alloc; stopped after 4 of 5 runs "
        "(--keep-going runs them all)"
    )


def test_the_quick_matrix_runs_several_allocations_in_one_process() -> None:
    """issue 41: once-per-process state shows only when a process allocates more than once. The
    quick matrix's sequences (alloc a, b; free a; alloc c; free b, c) do: mori 624002c warns of
    MADV_POPULATE_WRITE's EINVAL at every alloc (kernels before 5.14), umbp-sim once a process,
    so the two differ in warning count on 4.9 and in no sequence on 6.8; each side's steps
    follow the sequence."""
    from umbp_sim.allocator_spec import AllocatorSpec
    from umbp_sim.comparison import matrix
    from umbp_sim.run_router import BuiltinAllocator

    runs = [r for r in matrix.quick() if "] steps(" in r.label]
    assert len(runs) == 2 * 3 * 4  # kernels x pool states x backings
    a = BuiltinAllocator(AllocatorSpec("builtin", "umbp-sim"))
    b = BuiltinAllocator(AllocatorSpec("builtin", "mori-624002c"))
    populate = "MADV_POPULATE_WRITE"
    for r in runs:
        ra, rb = a.run(r), b.run(r)
        for rec in (ra, rb):
            assert [s.split()[0] for s in rec.steps] == [
                "alloc",
                "alloc",
                "freed",
                "alloc",
                "freed",
                "freed",
            ], (r.label, rec.steps)
        counts = (sum(populate in w for w in ra.warnings), sum(populate in w for w in rb.warnings))
        assert counts == ((1, 3) if " k4.9.0] " in r.label else (0, 0)), (r.label, counts)
        assert ("warning count" in differences(ra, rb)) == (" k4.9.0] " in r.label), r.label
