"""compare's classes of difference between two outcomes (umbp_sim.external.compare.differences),
on outcomes built by hand: no allocator runs."""

from __future__ import annotations

from umbp_sim.engine.record import RunRecord
from umbp_sim.external.compare import differences


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
    from umbp_sim.external.compare import CLASSES

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
