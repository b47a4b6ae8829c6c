"""``umbp-sim build-allocator``: compile an allocator (sources, or mori's checkout) against the
interposer, each compiler a bounded process."""
