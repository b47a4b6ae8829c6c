"""A pure-Python reference model of the allocator on a simulated host.

Written from docs/kernel-model.md (sections 0-2, 4, 5) and the allocator contract (issue 2),
not from the C++ simulator, so that a disagreement points at a bug in one of them. It predicts,
for each call, the result (valid or not, actual backing, mapped size, or a simulated crash) and
the hugepage counters, globally and per node.

What it covers:
  - private hugetlb mmap (AnonymousHugetlb) and shared memfd hugetlb (AnonymousShmHugetlb):
    reservation at mmap (``resv += delta`` while ``delta <= free - resv``, otherwise surplus
    pages from the buddy allocator within ``nr_overcommit_hugepages``; gigantic pages cannot be
    surplus before 6.19), ENOMEM -> demotion;
  - sizes: rounding to the base page / hugepage, hugepage sizes not a power of two or not above
    the base page (demoted without a syscall), sizes the kernel does not configure (mmap EINVAL,
    memfd ENODEV -> demotion), memfd absent before 3.17, MFD_HUGETLB absent before 4.14;
  - NUMA: numa_node in /sys/devices/system/node/possible binds (MPOL_BIND); others stay unbound;
  - prefault: MADV_POPULATE_WRITE (5.14+) takes each reserved page from the free lists of the
    allowed nodes in node order, else a surplus page on them within overcommit; when neither
    exists it is EFAULT, the allocator unmaps and demotes. Before 5.14 the allocator touches
    the pages and the same shortage is a SIGBUS (a crash of the simulated process);
  - munmap / last close: faulted pages go back to their node (dissolved while the node has
    surplus), unused reservations are returned and free surplus pages shrink;
  - ``echo N > nr_hugepages`` (global or per node): surplus becomes persistent first, new pages
    round-robin over the nodes, then free pages not needed by reservations are removed
    round-robin, the rest become surplus;
  - the shm registry: acquire/lookup/release, frees deferred while registrations are held.

Conventions docs/kernel-model.md does not fix (so the model and the simulator must agree on them):
the simulated task runs on node 0, so unbound faults and surplus pages take the lowest node
first; each round-robin loop of a nr_hugepages write (new pages, removed free pages, pages made
surplus) starts at the lowest allowed node. The kernel keeps its cursors (next_nid_to_alloc /
next_nid_to_free) across writes and loops; neither the model nor the simulator does.

Not covered: memory exhaustion of ordinary pages, overcommit / RLIMIT_AS / memcg / hugetlb
cgroup limits (tests use hosts where these cannot bite), task memory policies, injected faults.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from umbp_sim.machine import Machine
from umbp_sim.sim import HugePages
from umbp_sim.vocabulary.backing import (
    DEMOTED_TO as DEMOTED,
    HUGETLB_BACKINGS as HUGETLB,
    SHM_BACKINGS as SHM,
    alloc_outcome,
)


def _version_at_least(version: tuple[int, int, int], major: int, minor: int) -> bool:
    return version[:2] >= (major, minor)


@dataclass
class NodePool:
    nr: int = 0
    free: int = 0
    surp: int = 0


@dataclass
class HState:
    size: int
    resv: int = 0
    overcommit: int = 0
    nodes: dict[int, NodePool] = field(default_factory=dict)

    @property
    def nr(self) -> int:
        return sum(p.nr for p in self.nodes.values())

    @property
    def free(self) -> int:
        return sum(p.free for p in self.nodes.values())

    @property
    def surp(self) -> int:
        return sum(p.surp for p in self.nodes.values())

    @property
    def persistent(self) -> int:
        return self.nr - self.surp


@dataclass
class Buffer:
    """A live (or deferred-free) buffer as the model sees it."""

    requested: int
    mapped: int
    backing: str
    hugepage_size: int | None  # the hstate of a hugetlb buffer
    reserved: int = 0  # hugepages reserved, not faulted
    faulted: dict[int, int] = field(default_factory=dict)  # node -> hugepages faulted
    registrations: int = 0
    pending_free: bool = False


@dataclass(frozen=True)
class Prediction:
    outcome: str  # ok | demoted | failed | crashed
    backing: str | None = None
    mapped_size: int | None = None
    crash_node: int | None = None


class AllocatorModel:
    """The predicted state of one simulated host and the allocator running on it."""

    def __init__(self, machine: Machine) -> None:
        self.machine = machine
        self.page = machine.page_size
        self.version = machine.kernel_tuple()
        self.node_ids = sorted(n.id for n in machine.nodes if n.mem_total > 0)
        self.possible = set(machine.possible())
        self.hstates: dict[int, HState] = {}
        for size in machine.hugepage_sizes:
            h = HState(
                size,
                resv=machine.hugepages_reserved.get(size, 0),
                overcommit=machine.nr_overcommit_hugepages.get(size, 0),
            )
            for n in machine.nodes:
                pool = n.hugepages.get(size)
                h.nodes[n.id] = (
                    NodePool(pool.total, pool.free_pages(), pool.surplus) if pool else NodePool()
                )
            self.hstates[size] = h
        self.buffers: dict[str, Buffer] = {}
        self.bases: dict[str, int] = {}
        self.dead = False

    # ---- counters ------------------------------------------------------------------------
    def counters(self, size: int, node: int | None = None) -> HugePages:
        """The pool's counters, as SimHost.hugepages / node_hugepages give them."""
        h = self.hstates[size]
        if node is None:
            return HugePages(total=h.nr, free=h.free, reserved=h.resv, surplus=h.surp)
        p = h.nodes[node]
        return HugePages(total=p.nr, free=p.free, reserved=0, surplus=p.surp)

    def live_keys(self) -> list[str]:
        return [k for k, b in self.buffers.items() if not b.pending_free]

    # ---- hugepage arithmetic (docs/kernel-model.md sections 1, 2) ------------------------------
    def _gigantic(self, size: int) -> bool:
        order = 13 if self.page >= 65536 else 11 if self.page >= 16384 else 10
        return size > (self.page << order)

    def _may_surplus(self, h: HState) -> bool:
        if self._gigantic(h.size) and not _version_at_least(self.version, 6, 19):
            return False
        return h.surp < h.overcommit

    def _reserve(self, h: HState, delta: int) -> bool:
        if delta <= h.free - h.resv:
            h.resv += delta
            return True
        needed = h.resv + delta - h.free
        if self._gigantic(h.size) and not _version_at_least(self.version, 6, 19):
            return False
        if h.surp + needed > h.overcommit:
            return False
        # Surplus pages come from the buddy allocator, local node (the lowest) first; they join
        # the pool at mmap time.
        p = h.nodes[self.node_ids[0]]
        p.nr += needed
        p.free += needed
        p.surp += needed
        h.resv += delta
        return True

    def _fault_reserved(self, h: HState, buf: Buffer, allowed: list[int]) -> int | None:
        """Fault every reserved page of ``buf``; None, or the node the first failure was on."""
        while buf.reserved:
            node = next((n for n in allowed if h.nodes[n].free > 0), None)
            if node is not None:
                h.nodes[node].free -= 1
            elif self._may_surplus(h):
                node = allowed[0]
                h.nodes[node].nr += 1
                h.nodes[node].surp += 1
            else:
                return allowed[0]
            h.resv -= 1
            buf.reserved -= 1
            buf.faulted[node] = buf.faulted.get(node, 0) + 1
        return None

    def _release(self, buf: Buffer) -> None:
        """munmap of a private mapping / the last reference of a memfd: give everything back."""
        if buf.hugepage_size is None:
            return
        h = self.hstates[buf.hugepage_size]
        for node, count in buf.faulted.items():
            p = h.nodes[node]
            dissolved = min(count, p.surp)  # free_huge_folio: surplus pages leave the pool
            p.nr -= dissolved
            p.surp -= dissolved
            p.free += count - dissolved
        buf.faulted = {}
        unused = buf.reserved
        buf.reserved = 0
        h.resv -= unused
        # return_unused_surplus_pages: shrink free surplus pages, lowest node first.
        left = min(unused, h.surp)
        for node in sorted(h.nodes):
            if left <= 0:
                break
            p = h.nodes[node]
            k = min(left, p.free, p.surp)
            p.nr -= k
            p.free -= k
            p.surp -= k
            left -= k

    # ---- the allocator (issue 2 contract) -------------------------------------------------
    def alloc(
        self,
        key: str,
        size: int,
        backing: str,
        hugepage_size: int,
        numa_node: int,
        prefault: bool,
    ) -> Prediction:
        """Predict ``alloc``; on success the buffer is recorded under ``key``."""
        assert not self.dead
        if size == 0:
            return Prediction("failed")
        wanted = backing
        if backing in HUGETLB and (
            hugepage_size <= 0 or hugepage_size & (hugepage_size - 1) or hugepage_size <= self.page
        ):
            backing = DEMOTED[backing]
        result = self._attempt(key, size, backing, hugepage_size, numa_node, prefault)
        if result == "demote":
            result = self._attempt(key, size, DEMOTED[backing], hugepage_size, numa_node, prefault)
        if isinstance(result, Prediction):
            return result
        buf = self.buffers[key]
        return Prediction(alloc_outcome(wanted, buf.backing), buf.backing, buf.mapped)

    def _attempt(
        self, key: str, size: int, backing: str, hp: int, node: int, prefault: bool
    ) -> str | Prediction | None:
        huge = backing in HUGETLB
        align = hp if huge else self.page
        mapped = -(-size // align) * align
        if mapped >= 1 << 64:
            return Prediction("failed")
        shm = backing in SHM
        if shm and not _version_at_least(self.version, 3, 17):
            return "demote" if huge else Prediction("failed")  # memfd_create: ENOSYS
        if huge and shm and not _version_at_least(self.version, 4, 14):
            return "demote"  # MFD_HUGETLB unknown: EINVAL
        buf = Buffer(size, mapped, backing, hp if huge else None)
        if huge:
            h = self.hstates.get(hp)
            if h is None:
                return "demote"  # mmap EINVAL / memfd ENODEV: size not configured
            if not self._reserve(h, mapped // hp):
                return "demote"  # ENOMEM at mmap
            buf.reserved = mapped // hp
        bound = 0 <= node < 32767 and node in self.possible and node in self.node_ids
        allowed = [node] if bound else list(self.node_ids)
        if prefault and huge:
            h = self.hstates[hp]
            failed_on = self._fault_reserved(h, buf, allowed)
            if failed_on is not None:
                if not _version_at_least(self.version, 5, 14):
                    # Touching one byte per page: the missing page is a SIGBUS.
                    self.buffers[key] = buf
                    self.dead = True
                    return Prediction("crashed", crash_node=failed_on)
                self._release(buf)  # MADV_POPULATE_WRITE EFAULT: unmap (and close), demote
                return "demote"
        self.buffers[key] = buf
        return None

    def free(self, key: str) -> str:
        """Predict ``free``: 'freed', 'deferred' or 'noop' (already freed / never valid)."""
        buf = self.buffers.get(key)
        if buf is None or buf.pending_free:
            return "noop"
        if buf.backing in SHM and buf.registrations > 0:
            buf.pending_free = True
            return "deferred"
        self._release(buf)
        del self.buffers[key]
        return "freed"

    # The shm registry is keyed by address, as the allocator's is: a caller names a buffer by
    # its base (kept after Free zeroes the handle), and a freed base may be reused.
    def set_base(self, key: str, base: int) -> None:
        """Record where the simulator mapped buffer ``key``."""
        self.bases[key] = base

    def _containing(self, ptr: int, size: int) -> str | None:
        if ptr == 0 or size == 0:
            return None
        for key, buf in self.buffers.items():
            base = self.bases.get(key, 0)
            if base and base <= ptr < base + buf.mapped:
                ok = buf.backing in SHM and not buf.pending_free and ptr + size <= base + buf.mapped
                return key if ok else None
        return None

    def lookup(self, ptr: int, size: int) -> bool:
        return self._containing(ptr, size) is not None

    def acquire(self, ptr: int, size: int) -> bool:
        key = self._containing(ptr, size)
        if key is not None:
            self.buffers[key].registrations += 1
        return key is not None

    def release(self, base: int) -> str:
        """Predict ``release`` at ``base``: 'released', 'unmapped' (the deferred free ran), or
        'ignored'."""
        key = next(
            (k for k, b in self.buffers.items() if b.backing in SHM and self.bases.get(k) == base),
            None,
        )
        if key is None or base == 0 or self.buffers[key].registrations == 0:
            return "ignored"
        buf = self.buffers[key]
        buf.registrations -= 1
        if buf.registrations == 0 and buf.pending_free:
            self._release(buf)
            del self.buffers[key]
            return "unmapped"
        return "released"

    # ---- the administrator ---------------------------------------------------------------
    def set_nr_hugepages(self, size: int, count: int, node: int | None = None) -> None:
        """``echo count > nr_hugepages`` (set_max_huge_pages in mm/hugetlb.c)."""
        h = self.hstates[size]
        if node is not None:
            p = h.nodes[node]
            count += h.persistent - (p.nr - p.surp)
            allowed = [node]
        else:
            allowed = list(self.node_ids)
        # Surplus pages become persistent first.
        while h.surp > 0 and count > h.persistent:
            n = next((n for n in allowed if h.nodes[n].surp > 0), None)
            if n is None:
                break
            h.nodes[n].surp -= 1
        # Fresh pages, round-robin over the allowed nodes (memory is plentiful in the model).
        i = 0
        while count > h.persistent:
            p = h.nodes[allowed[i % len(allowed)]]
            p.nr += 1
            p.free += 1
            i += 1
        # Free pages not needed by reservations go back, round-robin, skipping empty nodes.
        min_count = max(count, h.resv + h.nr - h.free)
        cursor = 0
        while min_count < h.persistent:
            for step in range(len(allowed)):
                n = allowed[(cursor + step) % len(allowed)]
                if h.nodes[n].free > 0:
                    h.nodes[n].nr -= 1
                    h.nodes[n].free -= 1
                    cursor = (cursor + step + 1) % len(allowed)
                    break
            else:
                break
        # The rest become surplus, round-robin again from the lowest node.
        cursor = 0
        while count < h.persistent:
            for step in range(len(allowed)):
                n = allowed[(cursor + step) % len(allowed)]
                if h.nodes[n].surp < h.nodes[n].nr:
                    h.nodes[n].surp += 1
                    cursor = (cursor + step + 1) % len(allowed)
                    break
            else:
                break
