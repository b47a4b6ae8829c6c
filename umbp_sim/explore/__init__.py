"""Property-based exploration of the allocator: a reference model, hypothesis profiles, and
the writer that turns a shrunk failing schedule into a scenario file."""
