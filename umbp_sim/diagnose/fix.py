"""One fix: what it changes (the request, the Machine, admin writes on the host), the commands
a person would type, and the run that verified it; ``combine`` chains several into one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from umbp_sim.diagnose.replay_request import Request
from umbp_sim.diagnose.simulate import Simulation
from umbp_sim.engine.host_changes import HostChange
from umbp_sim.machine import Machine
from umbp_sim.sglang.host_memory import HICACHE_HOST_MEMORY_RESERVE_BYTES
from umbp_sim.sim import HostState

RequestChange = Callable[[Request], Request]
MachineChange = Callable[[Machine], Machine]

# Kinds that change what the request asks for (a compromise), as opposed to fixing the host.
COMPROMISES = ("node", "size", "buffer", "hicache", "no-hugepages", "backing")
# Of those, the ones that give up what the buffer is for (hugepages, its size): shown only when
# nothing milder gets the request everything.
HEAVY = ("buffer", "no-hugepages", "backing")
# Kinds whose commands change the whole host (pools, vm sysctls); "limits" covers the server's
# own cgroup and ulimit too, so its sysctl commands alone are host-wide.
HOST_WIDE = ("pool", "limits")


@dataclass
class Fix:
    action: str
    commands: list[str]
    category: str  # pool|node|size|buffer|hicache|env|limits|no-hugepages|backing|combined
    request_change: RequestChange | None = None
    host_changes: list[HostChange] = field(default_factory=list)
    machine_change: MachineChange | None = None
    parts: list[Fix] = field(default_factory=list)  # the singles of a combined fix
    run: Simulation | None = None
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
    # A pool grown by what the request's buffer needs (its pages short): sized for the request
    # of the run it was read from, so it is wrong beside a step that shrinks that request.
    sized_for_buffer: bool = False

    def __post_init__(self) -> None:
        self.key = self.key or " ; ".join(self.commands)

    @property
    def singles(self) -> list[Fix]:
        return self.parts or [self]

    @property
    def compromises(self) -> int:
        return sum(1 for f in self.singles if f.category in COMPROMISES)

    @property
    def host_wide(self) -> list[str]:
        """The steps that change the whole host (a sysctl, a hugepage pool): every other
        workload there lives with them, unlike a change to the server's own configuration."""
        return [
            c
            for f in self.singles
            for c in f.commands
            if f.category in HOST_WIDE and c.startswith(("sysctl ", "echo "))
        ]

    @property
    def safety(self) -> str | None:
        """None when, after the fix and its buffers, the host keeps what sglang's host check
        keeps for the rest of the server (10 GiB of MemAvailable) and each node with memory its
        share of it (by its MemTotal); else the figure that says why it is unsafe."""
        state = self.run.observed.state_after if self.run else None
        if state is None:
            return None
        left = state.numbers.mem_available
        if left < HICACHE_HOST_MEMORY_RESERVE_BYTES:
            return (
                f"unsafe: leaves {_gib(left)} of MemAvailable, under the 10 GiB sglang keeps "
                "for the rest of the server"
            )
        total = sum(n.mem_total for n in state.machine.nodes)
        for n in state.machine.nodes:
            if n.mem_total <= 0 or total <= 0:
                continue
            keep = HICACHE_HOST_MEMORY_RESERVE_BYTES * n.mem_total // total
            free = state.numbers.node(n.id).mem_free + state.reclaimable(n.id)
            if free < keep:
                return (
                    f"unsafe: leaves node {n.id} {_gib(free)} free or reclaimable, under its "
                    f"share ({_gib(keep)}) of the 10 GiB sglang keeps for the rest of the server"
                )
        return None

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
            "steps": [
                {"command": c, "knob": knob_of(c), "host_wide": c in self.host_wide}
                for c in self.commands
            ],
            "safety": self.safety,
        }


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def knob_of(command: str) -> str:
    """What a step's command changes: a sysctl (``vm.nr_hugepages``), a flag
    (``--hicache-size``), an environment variable or a file."""
    words = command.split()
    if words[:2] == ["sysctl", "-w"] and len(words) > 2:
        return words[2].partition("=")[0]
    if words and words[0] == "echo" and ">" in words:
        return words[words.index(">") + 1] if words.index(">") + 1 < len(words) else command
    if words and words[0] == "export" and len(words) > 1:
        return words[1].partition("=")[0]
    if words and "=" in words[0] and not words[0].startswith("-"):
        return words[0].partition("=")[0]
    return words[0] if words else command


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
