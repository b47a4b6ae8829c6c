"""External allocators as systems under test: the interposer, one subprocess per run, outcomes."""
