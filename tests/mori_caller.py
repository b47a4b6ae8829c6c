"""Code written against mori, knowing nothing of umbp-sim: it only imports mori.umbp."""

import mori.umbp
from mori.umbp import UMBPHostBufferBacking, UMBPHostMemAllocator

umbp = mori.umbp


def alloc_write_free(size: int) -> tuple[bool, object, int]:
    """Allocate ``size`` bytes of 4 KiB-page memory, write its first byte, free it."""
    import ctypes

    allocator = UMBPHostMemAllocator()
    handle = allocator.alloc(size, UMBPHostBufferBacking.Anonymous)
    ok = bool(handle)
    if not ok:
        return False, None, 0
    backing, size = handle.actual_backing, handle.requested_size
    ctypes.c_ubyte.from_address(handle.ptr).value = 0x5A
    allocator.free(handle)
    return True, backing, size
