"""One fix: what it changes (the request, the Machine, admin writes on the host), the commands
a person would type, and the run that verified it; ``combine`` chains several into one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from umbp_sim.diagnose.request import Request
from umbp_sim.diagnose.run import Run
from umbp_sim.machine import Machine
from umbp_sim.sim import HostState, SimHost

HostChange = Callable[[SimHost], "str | None"]
RequestChange = Callable[[Request], Request]
MachineChange = Callable[[Machine], Machine]

# Kinds that change what the request asks for (a compromise), as opposed to fixing the host.
COMPROMISES = ("node", "size", "buffer", "hicache", "no-hugepages", "backing")
# Of those, the ones that give up what the buffer is for (hugepages, its size): shown only when
# nothing milder gets the request everything.
HEAVY = ("buffer", "no-hugepages", "backing")


@dataclass
class Fix:
    action: str
    commands: list[str]
    category: str  # pool|node|size|buffer|hicache|env|limits|no-hugepages|backing|combined
    request_change: RequestChange | None = None
    host_changes: list[HostChange] = field(default_factory=list)
    machine_change: MachineChange | None = None
    parts: list[Fix] = field(default_factory=list)  # the singles of a combined fix
    run: Run | None = None
    key: str = ""  # identity for de-duplication (the commands, by default)
    # The action's text on the host the step starts from, where it names that host's numbers
    # ("N free"): a combination's steps are described on the state the steps before leave.
    describe: Callable[[HostState], str] | None = None
    # The steps whose run this one was read from (its numbers are that host's): with one of
    # them dropped from a combination, the action is said by its commands alone.
    sized_after: frozenset[str] = frozenset()
    # What the change sets on the host besides its admin writes (``host_changes``), as data for
    # what makes it last past a reboot (diagnose/persist.py): sysctls {"vm.KEY": "VALUE"}, and
    # the limits the server's service or container starts it with.
    sysctls: dict[str, str] = field(default_factory=dict)
    service: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.key = self.key or " ; ".join(self.commands)

    @property
    def singles(self) -> list[Fix]:
        return self.parts or [self]

    @property
    def compromises(self) -> int:
        return sum(1 for f in self.singles if f.category in COMPROMISES)

    @property
    def outcome_after(self) -> str:
        return self.run.summary() if self.run else "not run"

    def request(self, base: Request) -> Request:
        return self.request_change(base) if self.request_change else base

    def machine(self, base: Machine) -> Machine:
        return self.machine_change(base.copy()) if self.machine_change else base

    def to_json(self) -> dict[str, object]:
        return {
            "action": self.action,
            "commands": list(self.commands),
            "outcome_after": self.outcome_after,
            "outcome": self.run.outcome if self.run else None,
        }


def combine(fixes: list[Fix]) -> Fix:
    """One fix doing all of ``fixes`` in order (request changes compose, host writes chain)."""
    singles = [s for f in fixes for s in f.singles]
    if len(singles) == 1:
        return singles[0]
    req_changes = [f.request_change for f in singles if f.request_change]
    mach_changes = [f.machine_change for f in singles if f.machine_change]

    def req(r: Request) -> Request:
        for c in req_changes:
            r = c(r)
        return r

    def mach(m: Machine) -> Machine:
        for c in mach_changes:
            m = c(m)
        return m

    return Fix(
        "all of: " + "; ".join(f.action for f in singles),
        [c for f in singles for c in f.commands],
        "combined",
        request_change=req if req_changes else None,
        host_changes=[h for f in singles for h in f.host_changes],
        machine_change=mach if mach_changes else None,
        parts=singles,
    )


__all__ = [
    "COMPROMISES",
    "HEAVY",
    "Fix",
    "HostChange",
    "MachineChange",
    "RequestChange",
    "combine",
]
