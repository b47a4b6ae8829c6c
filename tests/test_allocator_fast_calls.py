"""alloc and free read from an allocator send plain calls straight to the native allocator
(csrc/python/bind_fast_calls.cpp) and every other call to the Python methods: both give the same
answers, errors and log records, read from the class they are the Python methods, and an
allocator still goes away as soon as its last reference does."""

from __future__ import annotations

import gc
import inspect
import logging
import sys
import weakref

import pytest

import umbp_sim
from umbp_sim import UMBPHostMemAllocator
from umbp_sim.allocator import MoriUMBPHostMemAllocator
from umbp_sim.machine import Machine
from umbp_sim.sim import build_kernel

FIELDS = ("requested_size", "mapped_size", "actual_backing", "actual_alignment", "numa_node")


def _fields(h: object) -> tuple[object, ...]:
    return tuple(getattr(h, f) for f in FIELDS)


def test_plain_and_keyword_calls_give_the_same_buffers() -> None:
    with umbp_sim.simulate(Machine.x86_64(nodes=2, hugepages={"2MiB": 8})):
        a = UMBPHostMemAllocator()
        plain = a.alloc(3 << 20, umbp_sim.AnonymousHugetlb, 2 << 20, 1, False)
        named = a.alloc(
            size=3 << 20,
            backing=umbp_sim.AnonymousHugetlb,
            hugepage_size=2 << 20,
            numa_node=1,
            prefault=False,
        )
        assert _fields(plain) == _fields(named) == (3 << 20, 4 << 20, umbp_sim.AnonymousHugetlb,
                                                    2 << 20, 1)  # fmt: skip
        a.free(plain)
        a.free(handle=named)
        assert not plain and not named


def test_read_from_the_class_they_are_the_python_methods() -> None:
    assert inspect.isfunction(UMBPHostMemAllocator.alloc)
    assert list(inspect.signature(UMBPHostMemAllocator.alloc).parameters) == [
        "self", "size", "backing", "hugepage_size", "numa_node", "prefault",
    ]  # fmt: skip
    a = UMBPHostMemAllocator(kernel=build_kernel(Machine.x86_64()))
    bound = a.alloc
    assert type(bound).__name__ == "FastBoundMethod"  # the native path, not a Python method
    assert bound.__self__ is a and bound.__func__ is UMBPHostMemAllocator.alloc
    assert repr(bound).startswith("<bound method UMBPHostMemAllocator.alloc of <umbp_sim.")
    # what a bound method says of itself
    assert (bound.__name__, bound.__qualname__) == ("alloc", "UMBPHostMemAllocator.alloc")
    assert bound.__doc__ == UMBPHostMemAllocator.alloc.__doc__
    assert list(inspect.signature(bound).parameters) == [
        "size", "backing", "hugepage_size", "numa_node", "prefault",
    ]  # fmt: skip
    assert bound == a.alloc and hash(bound) == hash(a.alloc) and bound != a.free
    assert bound != UMBPHostMemAllocator(kernel=build_kernel(Machine.x86_64())).alloc
    h = UMBPHostMemAllocator.alloc(a, 4096)  # the class's method, called as such
    assert h.mapped_size == 4096
    UMBPHostMemAllocator.free(a, h)
    assert not h


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((True,), {}),
        ((1.5,), {}),
        ((-1,), {}),
        ((2**64,), {}),
        ((4096, 0), {}),
        ((4096, umbp_sim.Anonymous, -4096), {}),
        ((4096, umbp_sim.Anonymous, 4096, 2**31), {}),
        ((4096, umbp_sim.Anonymous, 4096, 0, 2), {}),
        ((4096, umbp_sim.Anonymous, 4096, 0, True, 1), {}),
        ((), {}),
        ((), {"sizee": 1}),
        ((4096,), {"size": 1}),
    ],
)
def test_calls_that_are_not_plain_raise_as_the_method_does(
    args: tuple[object, ...], kwargs: dict[str, object]
) -> None:
    a = UMBPHostMemAllocator(kernel=build_kernel(Machine.x86_64()))
    with pytest.raises(Exception) as fast:
        a.alloc(*args, **kwargs)
    with pytest.raises(Exception) as method:
        UMBPHostMemAllocator.alloc(a, *args, **kwargs)
    assert (type(fast.value), str(fast.value)) == (type(method.value), str(method.value))
    assert str(fast.value)  # says what is wrong


@pytest.mark.parametrize(
    "args",
    [
        (2**64 - 1,),  # too large to map: an invalid handle, on both paths
        (0,),
        (4096, umbp_sim.AnonymousHugetlb, 2**64 - 1),
        (4096, umbp_sim.Anonymous, 4096, -(2**31)),  # below -1: no node, as -1
        (4096, umbp_sim.Anonymous, 4096, -5, False),
        (4096, umbp_sim.AnonymousShm, 4096, 1, True),
    ],
)
def test_plain_calls_at_the_edges_answer_as_the_method_does(args: tuple[object, ...]) -> None:
    with umbp_sim.simulate(Machine.x86_64(nodes=2)):
        a = UMBPHostMemAllocator()
        assert type(a.alloc).__name__ == "FastBoundMethod"
        fast = a.alloc(*args)
        method = UMBPHostMemAllocator.alloc(a, *args)
        assert bool(fast) == bool(method) and _fields(fast) == _fields(method)
        a.free(fast)
        a.free(method)


def test_free_of_something_else_raises_as_the_method_does() -> None:
    a = UMBPHostMemAllocator(kernel=build_kernel(Machine.x86_64()))
    with pytest.raises(TypeError, match="handle must be a UMBPHostBufferHandle, got int 3"):
        a.free(3)


def test_mori_conversions_still_apply_where_the_arguments_are_not_plain() -> None:
    with umbp_sim.simulate(Machine.x86_64()):
        m = MoriUMBPHostMemAllocator()
        h = m.alloc(True, prefault=None)  # mori's binding: True is 1, None is False
        assert (h.requested_size, h.mapped_size) == (1, 4096)
        m.free(h)
        with pytest.raises(AttributeError, match="no shm registry methods"):
            m.lookup_shm_allocation(0, 1)


def test_warnings_of_a_plain_call_are_logged_with_their_ids(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="umbp_sim.allocator")
    with umbp_sim.simulate(Machine.x86_64()):  # no hugepages: the hugetlb request falls back
        a = UMBPHostMemAllocator()
        h = a.alloc(2 << 20, umbp_sim.AnonymousHugetlb)
        assert h.actual_backing == umbp_sim.Anonymous
        a.free(h)
    assert [r.warning_id for r in caplog.records] and all(r.warning_id for r in caplog.records)


def test_an_allocator_goes_with_its_last_reference() -> None:
    a = UMBPHostMemAllocator(kernel=build_kernel(Machine.x86_64()))
    alloc = a.alloc  # a bound method keeps its allocator, as Python's do
    gone = weakref.ref(a)
    del a
    assert gone() is not None
    h = alloc(size=4096)  # not plain: through the method, whose self is still there
    assert h.mapped_size == 4096
    plain = alloc(8192)  # plain: straight to the native allocator it holds
    assert plain.mapped_size == 8192
    del alloc, h, plain
    assert gone() is None  # no cycle: no collection needed

    b = UMBPHostMemAllocator(kernel=build_kernel(Machine.x86_64()))
    b.keep = b.free  # type: ignore[attr-defined]  # a cycle through the bound method
    gone = weakref.ref(b)
    del b
    gc.collect()
    assert gone() is None


def test_bound_methods_made_and_dropped_leave_nothing_behind() -> None:
    a = UMBPHostMemAllocator(kernel=build_kernel(Machine.x86_64()))
    kind, func = type(a.alloc), UMBPHostMemAllocator.alloc
    before = (sys.getrefcount(kind), sys.getrefcount(func), sys.getrefcount(a))
    for _ in range(1000):
        made = (a.alloc, a.free)
        del made
    assert (sys.getrefcount(kind), sys.getrefcount(func), sys.getrefcount(a)) == before
