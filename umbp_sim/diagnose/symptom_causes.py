"""A symptom the dump does not reproduce: the hidden causes that give it, each simulated.

``replay DUMP REQUEST --symptom SIGBUS`` (or an OOM kill, or the demotion) on a host whose
replay does not show it: the server met a state the dump does not carry. Each candidate below
is one such state, set on the dumped Machine at the edge of what gives the symptom (the
largest limit, the fewest pages held), verified by its own run, with the run just past the
edge, what to collect to confirm it and what to change if it is confirmed (docs/symptoms.md):

- ``hugetlb_cgroup``: the server's hugetlb cgroup limit (``hugetlb.<size>.max``; cgroup v1's
  ``hugetlb.<size>.limit_in_bytes``; a Kubernetes pod without ``resources.limits.hugepages-*``
  gets 0), charged at fault time;
- ``hugetlb_rsvd_cgroup``: its reservation limit (``hugetlb.<size>.rsvd.max``), met at mmap;
- ``hugetlbfs_files``: pages held by files left in a hugetlbfs mount (``/dev/hugepages``,
  DPDK's ``rtemap_*`` after a crash): in use, with no process mapping them;
- ``node_pool``: the bound node's pool smaller than the buffer (pages come from the bound node
  at fault time; the reservation is host-wide);
- ``hugepages_taken``: other processes' reservations (``HugePages_Rsvd``), as the error-line
  search tries them (``hypotheses._moment_changes``);
- ``memcg``: the memory cgroup limit (``memory.max``), an OOM kill of base-page faults;
- ``host_memory``: the host's memory used by other processes, the kernel's OOM killer.

A candidate that does not give the symptom is kept with what it gives (ruled out). For an OOM
kill of a hugepage request, the memory causes are tried again after the first change that
sent the allocator to base pages: both at once give it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from umbp_sim.diagnose.explain import pages_needed
from umbp_sim.diagnose.hypotheses import (
    _HUGETLBFS,
    HypothesisSearch,
    Tried,
    _held,
    _moment_changes,
    _Searcher,
    _size,
)
from umbp_sim.host.host_nodes import HugePool
from umbp_sim.vocabulary.backing import HUGETLB_BACKINGS
from umbp_sim.vocabulary.units import cgroup_hugetlb_name, pod_hugepages_limit, spaced_size

if TYPE_CHECKING:
    from umbp_sim.diagnose.replay_request import Request
    from umbp_sim.dump import DumpFacts
    from umbp_sim.machine import Machine

MiB = 1 << 20

_CGROUP_OF_SERVER = (
    "umbp-sim collect --pid PID of the server (its cgroup's limits under their v2 names), or "
    "in its container: grep . /sys/fs/cgroup/hugetlb.*.max /sys/fs/cgroup/hugetlb.*.events "
    "(cgroup v1: /sys/fs/cgroup/hugetlb/hugetlb.*.limit_in_bytes and hugetlb.*.failcnt)"
)
_POD = "a pod: kubectl get pod POD -o yaml (resources.limits: hugepages-2Mi, memory)"
_MAPPED = (
    "HugePages_Total - HugePages_Free against what processes map: grep -h huge "
    "/proc/[0-9]*/numa_maps (N<node>=<pages> per mapping)"
)
_OOM_LOG = (
    "the kernel's log of the kill: journalctl -k | grep -iE -A20 'invoked oom-killer' (its "
    "constraint: CONSTRAINT_MEMCG is a cgroup's limit, CONSTRAINT_NONE the host's memory; it "
    "lists each process's memory)"
)


# For an OOM kill of a hugepage request: which change sends the allocator to base pages first.
_DEMOTION_FIRST = ("hugetlbfs_files", "hugepages_taken", "node_pool", "hugetlb_cgroup")


@dataclass(frozen=True)
class _Candidate:
    kind: str
    edge: tuple[str, dict[str, Any]]  # the change at the edge: it should give the symptom
    beyond: tuple[str, dict[str, Any]] | None  # one step past it: it should not
    cause: str
    collect: tuple[str, ...]
    fix: tuple[str, ...]


def _from_pod(facts: DumpFacts | None) -> bool:
    """The dump's hugetlb limit is a pod's (a paste of its limits: umbp_sim/dump/paste.py)."""
    from umbp_sim.dump.paste import pod_hugetlb_limits

    return facts is not None and pod_hugetlb_limits(facts)


def _hugetlb_cgroup(s: _Searcher, facts: DumpFacts | None, size: int, need: int) -> _Candidate:
    m, name, kb = s.machine, cgroup_hugetlb_name(size), spaced_size(size)
    edge = (need - 1) * size
    now = m.hugetlb_cgroup_max.get(size)
    dumped = f"{s.shows} {_size(now)}" if now is not None else f"{s.shows} no limit"
    pod = pod_hugepages_limit(size, need * size)
    service = f"echo max > /sys/fs/cgroup/<server cgroup>/hugetlb.{name}.max"
    fix = (f"{pod} in the pod spec",) if _from_pod(facts) else (
        service, f"a pod: {pod} in its spec")  # fmt: skip
    return _Candidate(
        "hugetlb_cgroup",
        (f"hugetlb.{name}.max {_size(edge)}", {"hugetlb_cgroup_max": {**m.hugetlb_cgroup_max,
                                                                      size: edge}}),
        (f"hugetlb.{name}.max {_size(need * size)}",
         {"hugetlb_cgroup_max": {**m.hugetlb_cgroup_max, size: need * size}}),
        f"the server's hugetlb cgroup limit for {kb} pages (hugetlb.{name}.max; cgroup v1: "
        f"hugetlb.{name}.limit_in_bytes) was below the {_size(need * size)} its buffer faults "
        f"({dumped}): the limit is charged page by page at fault time, so the mmap passes and "
        f"the prefault meets it; a Kubernetes pod whose spec sets no resources.limits."
        f"hugepages-{name.replace('MB', 'Mi').replace('GB', 'Gi')} gets a limit of 0; "
        f"simulated, any limit up to {_size(edge)} gives it",
        (_CGROUP_OF_SERVER, _POD),
        fix,
    )  # fmt: skip


def _rsvd_cgroup(s: _Searcher, size: int, need: int) -> _Candidate:
    m, name = s.machine, cgroup_hugetlb_name(size)
    edge = (need - 1) * size
    return _Candidate(
        "hugetlb_rsvd_cgroup",
        (f"hugetlb.{name}.rsvd.max {_size(edge)}",
         {"hugetlb_cgroup_rsvd_max": {**m.hugetlb_cgroup_rsvd_max, size: edge}}),
        (f"hugetlb.{name}.rsvd.max {_size(need * size)}",
         {"hugetlb_cgroup_rsvd_max": {**m.hugetlb_cgroup_rsvd_max, size: need * size}}),
        f"the server's hugetlb reservation limit (hugetlb.{name}.rsvd.max, Linux 5.7+) was "
        f"below the {_size(need * size)} its mmap reserves: the hugetlb mmap fails with ENOMEM",
        (_CGROUP_OF_SERVER,),
        (f"echo max > /sys/fs/cgroup/<server cgroup>/hugetlb.{name}.rsvd.max",),
    )  # fmt: skip


def _hugetlbfs_files(s: _Searcher, size: int, need: int, node: int) -> _Candidate | None:
    m, kb = s.machine, spaced_size(size)
    at = _held(m, size, need - 1, node)
    past = _held(m, size, need, node)
    if at is None:
        return None
    where = f" on node {node}" if node >= 0 else ""
    return _Candidate(
        "hugetlbfs_files",
        (f"files in a hugetlbfs mount holding {at[1]} {kb} pages{where}", at[0]),
        (f"files holding {past[1]} pages{where}", past[0]) if past else None,
        f"files left in a hugetlbfs mount (e.g. /dev/hugepages, DPDK's rte map files after a "
        f"crash) held {at[1]} of the free {kb} pages{where}, leaving {need - 1} of the {need} "
        "the buffer needs: such pages stay in use (HugePages_Free low) with no process "
        "mapping them",
        (_HUGETLBFS, _MAPPED),
        ("remove the files: rm /dev/hugepages/rtemap_* (those no running process uses); or "
         "reboot",),
    )  # fmt: skip


def _node_pool(s: _Searcher, size: int, need: int, node: int) -> _Candidate | None:
    m, kb = s.machine, spaced_size(size)

    def smaller(pages: int) -> dict[str, Any] | None:
        nodes = [replace(n, hugepages=dict(n.hugepages)) for n in m.nodes]
        target = next((n for n in nodes if n.id == node), None)
        if target is None or target.hugepages.get(size, HugePool()).total <= pages:
            return None
        target.hugepages[size] = HugePool(total=pages, free=pages)
        free = sum(n.hugepages[size].free_pages() for n in nodes if size in n.hugepages)
        return {
            "nodes": nodes,
            "hugepages_reserved": {
                **m.hugepages_reserved,
                size: min(m.hugepages_reserved.get(size, 0), free),
            },
        }

    at, past = smaller(need - 1), smaller(need)
    if at is None:
        return None
    path = f"/sys/devices/system/node/node{node}/hugepages/hugepages-{size >> 10}kB/nr_hugepages"
    return _Candidate(
        "node_pool",
        (f"node {node}'s pool of {kb} pages at {need - 1}", at),
        (f"node {node}'s pool at {need}", past) if past else None,
        f"node {node}'s pool of {kb} pages held fewer than the {need} the buffer needs when "
        f"the server started: the mmap's reservation is host-wide, but the pages come from the "
        f"bound node at fault time",
        (f"{path} and free_hugepages beside it at the time of the failure (a monitoring "
         "history), and how the pool is set at boot (/etc/sysctl.d, hugepages= in "
         "/proc/cmdline, a unit writing nr_hugepages per node)", _MAPPED),
        (f"reserve the pages on node {node}: echo <at least {need}> > {path}",),
    )  # fmt: skip


def _memcg(s: _Searcher, total: int) -> _Candidate:
    m = s.machine
    edge = max(m.page_size, total - m.page_size)
    return _Candidate(
        "memcg",
        (f"memory.max {_size(edge)}", {"memcg_max": edge}),
        (f"memory.max {_size(total)}", {"memcg_max": total}),
        f"the server's memory cgroup limit (memory.max; cgroup v1: memory.limit_in_bytes; a "
        f"pod's resources.limits.memory) was below the {_size(total)} its buffer faults on "
        "base pages: the cgroup's OOM killer kills the server in the prefault",
        (_OOM_LOG, "the container's limit: cat /sys/fs/cgroup/memory.max (v1: "
         "memory.limit_in_bytes) in it, or umbp-sim collect --pid PID; " + _POD),
        ("raise the server's memory limit above the buffer and what else it holds "
         "(resources.limits.memory of a pod; echo max > /sys/fs/cgroup/<server cgroup>/"
         "memory.max)",),
    )  # fmt: skip


def _host_memory(m: Machine, total: int) -> _Candidate:
    count = len(m.nodes)
    each = max(m.page_size, total // 2 // count // m.page_size * m.page_size)
    nodes = [replace(n, mem_free=min(n.mem_total, each), page_cache=0, slab_reclaimable=0)
             for n in m.nodes]  # fmt: skip
    return _Candidate(
        "host_memory",
        (f"{_size(each)} free and nothing reclaimable on each node (other processes' memory)",
         {"nodes": nodes, "mem_free": None, "mem_available": None, "page_cache": 0,
          "slab_reclaimable": 0}),
        None,
        "other processes used the host's memory when the server started: with less free and "
        "reclaimable than its buffer, the prefault on base pages runs the node out of memory "
        "and the kernel's OOM killer kills the server",
        (_OOM_LOG, "MemAvailable around the time of the failure (node_exporter's "
         "node_memory_MemAvailable_bytes, sar -r)"),
        ("find what held the memory in the OOM report's process table; give the server a "
         "host (or NUMA node) with the buffer's memory free",),
    )  # fmt: skip


def _try(s: _Searcher, c: _Candidate, before: tuple[str, str, dict[str, Any]] | None = None
         ) -> Tried:  # fmt: skip
    """Run the candidate at its edge (after ``before``'s change); keep it when it gives the
    symptom, with the run past its edge. Returns the edge's run."""
    first = before[2] if before else {}
    said = f"{before[1]}, " if before else ""
    tried, _ = s.run(said + c.edge[0], **{**first, **c.edge[1]})
    if not tried.reproduces:
        s.found.ruled_out.append(tried)
        return tried
    beyond = None
    if c.beyond is not None:
        beyond, _ = s.run(said + c.beyond[0], **{**first, **c.beyond[1]})
    kind = f"{before[0]}+{c.kind}" if before else c.kind
    cause = (f"{before[1]} (so the allocator falls back to base pages), and {c.cause}"
             if before else c.cause)  # fmt: skip
    s.keep(kind, cause, tried, beyond, c.collect, c.fix)
    return tried


def symptom_search(
    machine: Machine,
    facts: DumpFacts | None,
    request: Request,
    baseline: str,
    profile: str | None = None,
) -> HypothesisSearch:
    """The hidden causes of ``request.symptom`` on ``machine`` (``baseline``: the replay's
    outcome there), each at its edge and verified (hypotheses.search's searcher and records)."""
    s = _Searcher(machine, request, profile, facts=facts)
    m = machine
    assert request.symptom is not None
    backing, hp, node, _prefault = request.settings()
    size = hp if hp in m.hugepage_sizes else m.default_hugepage_size
    hugetlb = backing in HUGETLB_BACKINGS and size is not None
    total = sum(request.buffer_sizes()) * request.ranks
    demoting: list[tuple[str, str, dict[str, Any]]] = []
    if hugetlb:
        assert size is not None
        need = pages_needed(request, size) * request.ranks
        pool: list[_Candidate | None] = [_hugetlb_cgroup(s, facts, size, need)]
        if node >= 0:
            pool.append(_node_pool(s, size, need, node))
        pool.append(_hugetlbfs_files(s, size, need, node))
        pool.append(_rsvd_cgroup(s, size, need))
        for c in pool:
            if c is None:
                continue
            tried = _try(s, c)
            if tried.outcome == "demoted" and baseline != "demoted":
                demoting.append((c.kind, c.edge[0], c.edge[1]))
        for kind, change, fields in _moment_changes(s):
            if kind in ("memcg", "hugetlbfs_files"):
                continue  # tried at its edge, with its own collect and fix
            tried, _ = s.run(change, **fields)
            if tried.reproduces:
                s.keep(kind, change, tried, None, (_MAPPED,))
            else:
                s.found.ruled_out.append(tried)
                if tried.outcome == "demoted" and baseline != "demoted":
                    demoting.append((kind, change, fields))
    for c in (_memcg(s, total), _host_memory(m, total)):
        _try(s, c)
    if request.symptom.kind == "oom-kill" and demoting:
        # the pool short (the field's usual demotion) before a reservation limit
        first = min(demoting, key=lambda d: _DEMOTION_FIRST.index(d[0]) if d[0] in
                    _DEMOTION_FIRST else len(_DEMOTION_FIRST))  # fmt: skip
        # its nodes (pools) under the memory change's
        for c in (_memcg(s, total), _host_memory(replace(m, **first[2]), total)):
            _try(s, c, first)
    return s.found
