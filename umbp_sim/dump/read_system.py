"""Reading a dump's nodes, sysctls, kernel version, process limits and zone watermarks into
``DumpFacts``; the rules are in ``umbp_sim.dump.facts``'s docstring."""

from __future__ import annotations

from umbp_sim import _native
from umbp_sim.collect_scripts.standalone_collect import HUGETLBFS, NODE_LISTS, V1_UNLIMITED
from umbp_sim.dump.dump_error import DumpError
from umbp_sim.dump.host_facts import (
    _NODE_DIR_RE,
    DEFAULT_KERNEL_VERSION,
    NODES,
    DumpFacts,
    NodeFacts,
    _Reader,
)
from umbp_sim.dump.parse import (
    MAX_NODES,
    parse_cgroup_max,
    parse_cpulist,
    parse_distance,
    parse_limits,
    parse_node_meminfo,
    parse_nodelist,
    parse_osrelease,
    parse_proc_version,
)
from umbp_sim.vocabulary.bounded import shown
from umbp_sim.vocabulary.units import cgroup_hugetlb_name
from umbp_sim.vocabulary.value_types import MAX_BYTES, MAX_INT


def _read_watermarks(r: _Reader) -> None:
    """Σ of the zones' low watermarks: proc/zoneinfo, else 5/4 of vm.min_free_kbytes."""
    f = r.facts
    if r.src.bare_meminfo:
        return
    t = r.text("proc/zoneinfo", record=False)
    if t is not None:
        pages = 0
        for i, line in enumerate(t.splitlines(), 1):
            parts = line.split()
            if len(parts) == 2 and parts[0] == "low" and parts[1].isdigit():
                # a count int() can read and the sum can hold (int() stops at 4,300 digits)
                digits = parts[1].lstrip("0")
                if len(digits) > 19 or (pages + int(parts[1])) * f.page_size >= MAX_BYTES:
                    raise DumpError(
                        r.src.where("proc/zoneinfo"),
                        f"low {shown(parts[1])}: the low watermarks are beyond what umbp-sim "
                        "simulates (below 2^62 bytes)",
                        i,
                    )
                pages += int(parts[1])
        f.watermark_low = pages * f.page_size
        return
    mfk = r.int("proc/sys/vm/min_free_kbytes", record=False)
    if mfk is not None:
        f.watermark_low = _native.watermark_low_from_min_free_kbytes(mfk)


def _read_nodes(r: _Reader) -> None:
    f = r.facts
    if r.src.bare_meminfo:
        f.note(
            "bare-meminfo", "a bare meminfo: no NUMA information (one node, node 0, in the Machine)"
        )
        return
    ids = []
    for name in r.src.listdir(NODES):
        m = _NODE_DIR_RE.match(name)
        if m and len(m.group(1)) <= 5:
            nid = int(m.group(1))
            if nid >= MAX_NODES:
                raise DumpError(r.src.where(f"{NODES}/{name}"), f"node id {nid} >= {MAX_NODES}")
            ids.append(nid)
    for key in NODE_LISTS:
        t = r.text(f"{NODES}/{key}")
        if t is not None:
            setattr(
                f,
                key if key == "has_memory" else f"{key}_nodes",
                parse_nodelist(t, r.src.where(f"{NODES}/{key}")),
            )
    f.numa_sysfs = bool(ids) or f.online_nodes is not None or f.possible_nodes is not None
    if not f.numa_sysfs:
        f.note(
            "no-numa-sysfs",
            "the paste shows no NUMA node: one node, node 0, in the Machine (numactl -H shows them)"
            if r.src.paste
            else f"no {NODES}: no NUMA information (one node, node 0, in the Machine)",
        )
        return
    if not ids:
        ids = list(f.online_nodes or f.possible_nodes or [])
        f.note(
            "nodes-from-online-list",
            f"no nodeN directories: nodes taken from the online list {ids}",
        )
    for nid in sorted(ids):
        node = NodeFacts(nid)
        base = f"{NODES}/node{nid}"
        t = r.text(f"{base}/meminfo")
        if t is not None:
            nm = parse_node_meminfo(t, nid, r.src.where(f"{base}/meminfo"))
            node.mem_total = nm.get("MemTotal")
            node.mem_free = nm.get("MemFree")
            if "Active(file)" in nm and "Inactive(file)" in nm:
                node.page_cache = nm["Active(file)"] + nm["Inactive(file)"]
            elif "FilePages" in nm:  # kernels without the file LRU lines (facts.py)
                node.page_cache = max(0, nm["FilePages"] - nm.get("Shmem", 0))
            node.slab_reclaimable = nm.get("SReclaimable")
            node._meminfo = nm  # type: ignore[attr-defined]
        t = r.text(f"{base}/cpulist")
        if t is not None:
            node.cpus = parse_cpulist(t, r.src.where(f"{base}/cpulist"))
        t = r.text(f"{base}/distance")
        if t is not None:
            node.distances = parse_distance(t, r.src.where(f"{base}/distance"))
        f.nodes.append(node)


def _read_sysctls(r: _Reader, mi: dict[str, int]) -> None:
    f = r.facts
    vm = "proc/sys/vm"
    f.nr_hugepages = r.int(f"{vm}/nr_hugepages")
    om = r.int(f"{vm}/overcommit_memory")
    if om is not None and om not in (0, 1, 2):
        raise DumpError(r.src.where(f"{vm}/overcommit_memory"), f"{om} is not 0, 1 or 2", 1)
    f.overcommit_memory = om
    f.overcommit_ratio = r.int(f"{vm}/overcommit_ratio")
    if f.overcommit_ratio is not None and f.overcommit_ratio > MAX_INT:
        raise DumpError(r.src.where(f"{vm}/overcommit_ratio"),
                        f"{f.overcommit_ratio} does not fit the kernel's int", 1)  # fmt: skip
    f.overcommit_kbytes = r.int(f"{vm}/overcommit_kbytes")
    if f.overcommit_kbytes is not None and f.overcommit_kbytes * 1024 >= MAX_BYTES:
        raise DumpError(r.src.where(f"{vm}/overcommit_kbytes"), f"{f.overcommit_kbytes} kB is "
                        "beyond what umbp-sim simulates (below 2^62 bytes)", 1)  # fmt: skip
    r.int(f"{vm}/nr_overcommit_hugepages")  # recorded as missing if absent; read in pools
    f.admin_reserve_kbytes = r.int(f"{vm}/admin_reserve_kbytes", record=False)
    f.user_reserve_kbytes = r.int(f"{vm}/user_reserve_kbytes", record=False)


def inferred_overcommit_ratio(f: DumpFacts) -> int | None:
    """The overcommit_ratio the dump's CommitLimit was computed with: SimKernel's
    vm_commit_limit solved for it (None when no whole ratio gives it)."""
    if f.commit_limit is None:
        return None
    pool = sum(p.total * s for s, p in f.hugepages.items())
    # a pool at least MemTotal leaves no memory to solve with, as any larger one
    return _native.solve_overcommit_ratio(
        f.commit_limit, f.mem_total, min(pool, f.mem_total), f.swap_total or 0
    )


def _read_kernel_version(r: _Reader, mi: dict[str, int]) -> None:
    f = r.facts
    t = r.text("proc/sys/kernel/osrelease")
    if t is not None:
        f.kernel_version = parse_osrelease(t, r.src.where("proc/sys/kernel/osrelease"))
        f.kernel_version_source = "osrelease"
        return
    t = r.text("proc/version", record=False) if not r.src.bare_meminfo else None
    if t is not None:
        f.kernel_version = parse_proc_version(t, r.src.where("proc/version"))
        f.kernel_version_source = "proc/version"
        f.note(
            "kernel-version-from-proc-version",
            f"kernel version {f.kernel_version} from proc/version (no osrelease)",
        )
        return
    if r.src.paste:  # a line not shown dates nothing (issue 39)
        f.kernel_version = DEFAULT_KERNEL_VERSION
        f.kernel_version_source = "default"
        f.note(
            "kernel-version-unknown",
            f"the kernel release is not in the paste: taken as a recent kernel, {f.kernel_version} "
            "(MADV_POPULATE_WRITE, memfd_create with MFD_HUGETLB); `uname -r` settles it",
        )
        return
    f.kernel_version_source = "meminfo"
    if f.meminfo_source == "nodes":  # node files date nothing
        f.kernel_version = DEFAULT_KERNEL_VERSION
        f.kernel_version_source = "default"
        why = "no proc/meminfo, osrelease or proc/version dates it: the default"
    elif "MemAvailable" not in mi:
        f.kernel_version = "3.13.0"
        why = "meminfo has no MemAvailable (added in 3.14)"
    elif "HugePages_Total" in mi and "Hugetlb" not in mi:
        f.kernel_version = "4.15.0"
        why = "meminfo has no Hugetlb: line (added in ~4.16)"
    else:
        f.kernel_version = DEFAULT_KERNEL_VERSION
        f.kernel_version_source = "default"
        why = "nothing in the dump dates it: the default"
    f.note("kernel-version-assumed", f"kernel version taken as {f.kernel_version}: {why}")


_CAP_SYS_ADMIN, _CAP_SYS_NICE = 21, 23  # CapEff bits (linux/capability.h)


def _read_credentials(r: _Reader) -> None:
    """The server's credentials from proc/self/status (``collect --pid`` writes the server's
    Uid and Cap* lines there): root is CAP_SYS_ADMIN in CapEff, what the kernel checks (a
    container's uid 0 often lacks it)."""
    f = r.facts
    t = r.text("proc/self/status", record=False)
    if t is None:
        return
    fields = dict(line.split(":", 1) for line in t.splitlines()[:64] if ":" in line)
    cap = fields.get("CapEff", "").strip()
    ids = fields.get("Uid", "").split()
    if not (0 < len(cap) <= 16 and all(c in "0123456789abcdefABCDEF" for c in cap)) or not (
        len(ids) == 4 and all(i.isascii() and i.isdecimal() and len(i) <= 10 for i in ids)
    ):
        f.note("credentials-unreadable",
               f"{r.src.where('proc/self/status')}: no readable Uid and CapEff lines: the "
               "server taken as privileged")  # fmt: skip
        return
    caps, f.uid = int(cap, 16), int(ids[1])
    f.root = bool(caps >> _CAP_SYS_ADMIN & 1)
    nice = bool(caps >> _CAP_SYS_NICE & 1)
    if f.root and nice:
        return
    lacks = [n for n, has in (("CAP_SYS_ADMIN", f.root), ("CAP_SYS_NICE", nice)) if not has]
    # What each missing capability changes (root in the simulation is CAP_SYS_ADMIN's).
    follows = []
    if not f.root:
        follows.append("overcommit_memory 2 keeps vm.admin_reserve_kbytes back from it")
    if not nice:
        follows.append("mbind's MPOL_MF_MOVE_ALL would be refused (EPERM)"
                       + ("" if not f.root else "; the simulation, which takes root from "
                          "CAP_SYS_ADMIN, grants it, and neither built-in allocator asks "
                          "for it"))  # fmt: skip
    f.note("credentials-unprivileged",
           f"the server ran as uid {f.uid} without {' and '.join(lacks)} (CapEff {cap}): "
           + ", and ".join(follows))  # fmt: skip


def _read_limits(r: _Reader) -> None:
    f = r.facts
    _read_credentials(r)
    t = r.text("proc/self/limits")
    if t is not None:
        limits = parse_limits(t, r.src.where("proc/self/limits"))
        if "Max address space" in limits:
            soft = limits["Max address space"][0]
            f.rlimit_as = "unlimited" if soft is None else soft
        else:
            f.note(
                "rlimit-as-unknown",
                "proc/self/limits has no 'Max address space' line: RLIMIT_AS unknown",
            )
    _read_hugetlbfs_files(r)
    v = _cgroup_limit(r, "memory", "memory.max", "memory.limit_in_bytes", record=True)
    if v is not None:
        f.memcg_max = v
    for size in f.hugepage_sizes:
        name = cgroup_hugetlb_name(size)
        for kind, by_size in (("", f.hugetlb_cgroup_max), ("rsvd.", f.hugetlb_cgroup_rsvd_max)):
            v = _cgroup_limit(
                r, "hugetlb", f"hugetlb.{name}.{kind}max", f"hugetlb.{name}.{kind}limit_in_bytes"
            )
            if v is not None:
                by_size[size] = v


_PAGESIZE_SHIFT = {"K": 10, "M": 20, "G": 30}


def _read_hugetlbfs_files(r: _Reader) -> None:
    """The collectors' HUGETLBFS listing: files left in hugetlbfs mounts hold their pages (in
    use, counted in the pools' free counts already), a note naming them and their fix."""
    f = r.facts
    t = r.text(HUGETLBFS, record=False)
    if t is None:
        return
    held: dict[int, int] = {}
    named: list[str] = []
    for n, line in enumerate(t.splitlines(), 1):
        parts = line.split("\t")
        if len(parts) != 4 or not parts[3].isdigit() or len(parts[3]) > 15:
            raise DumpError(r.src.where(HUGETLBFS), "expected MOUNT, PAGESIZE, NAME, KB", n)
        mount, pagesize, name, kb = parts
        size = f.default_hugepage_size
        if pagesize[:-1].isdigit() and len(pagesize) <= 8 and pagesize[-1] in _PAGESIZE_SHIFT:
            size = int(pagesize[:-1]) << _PAGESIZE_SHIFT[pagesize[-1]]
        if not size or int(kb) == 0:
            continue
        pages = -(-(int(kb) << 10) // size)  # a file holds whole pages
        held[size] = held.get(size, 0) + pages
        named.append(f"{mount.rstrip('/')}/{name}")
    if not held:
        return
    f.hugetlbfs_held = held
    pools = ", ".join(f"{p} of {s >> 10} kB" for s, p in sorted(held.items()))
    mounts = sorted({x.rsplit("/", 1)[0] for x in named})
    f.note("hugetlbfs-files", f"{len(named)} file(s) left in hugetlbfs mounts hold {pools} "
           f"pages ({shown_files(named)}): in use with no process needing to map them, so "
           f"HugePages_Free stays low; remove those no running process uses (rm "
           f"{mounts[0]}/rtemap_*, ...) or reboot")  # fmt: skip


def shown_files(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _cgroup_limit(
    r: _Reader, controller: str, v2: str, v1: str, record: bool = False
) -> int | str | None:
    """A cgroup limit: ``sys/fs/cgroup/<v2>`` (cgroup v2, and both collectors, which write a v1
    limit under its v2 name), else cgroup v1's file: ``sys/fs/cgroup/<controller>/<v1>`` (a
    container's own cgroup, where v1 mounts each controller) or ``sys/fs/cgroup/<v1>`` (copied
    flat). Bytes, "max" (v1's PAGE_COUNTER_MAX pages, 9223372036854771712 with 4 KiB pages,
    is v2's max), or None: the dump has neither."""
    f = r.facts
    rel = f"sys/fs/cgroup/{v2}"
    t = r.text(rel, record=False)
    if t is None:
        for rel in (f"sys/fs/cgroup/{controller}/{v1}", f"sys/fs/cgroup/{v1}"):
            t = r.text(rel, record=False)
            if t is not None:
                v = parse_cgroup_max(t, r.src.where(rel))
                limit: int | str = "max" if v is None or v >= V1_UNLIMITED else v
                f.note("cgroup-v1-limit", f"{rel}: cgroup v1's {v1}, read as v2's {v2} "
                       f"({limit})")  # fmt: skip
                return limit
        if record:
            r.text(f"sys/fs/cgroup/{v2}")  # listed as missing, as before
        return None
    v = parse_cgroup_max(t, r.src.where(rel))
    return "max" if v is None else v
