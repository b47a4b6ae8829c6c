"""Tests of external allocators (issue 14): the C ABI, the interposer, compare."""
