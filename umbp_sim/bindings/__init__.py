"""C++ sources umbp-sim ships for building allocators under test (``umbp-sim build-allocator``)."""
