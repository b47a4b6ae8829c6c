"""The simulated host's internals beside ``umbp_sim.machine`` and ``umbp_sim.sim``: nodes and
pools, the sizes each architecture registers, the named machines, the syscall trace and the
leak accounting."""
