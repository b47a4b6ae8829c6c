"""Text as people paste it into a ticket, read as a dump: ``paste_source(data, label)``.

A paste is any text file or standard input that is not a dump tarball (a whole ``/proc/meminfo``
is one too). Each line is read on its own, in any order, mixed with shell prompts and other
output; the forms read (docs/pastes.md lists them with examples):

- meminfo lines, whole or grep'd (``HugePages_Free:  512``), and per-node ones
  (``Node 1 HugePages_Free:  0``), also with grep's ``path:`` in front;
- sysfs and procfs values as ``path:value`` (``grep -r . /sys/.../hugepages``) or as the line
  after a ``cat PATH`` / ``sysctl -n KEY`` prompt: ``/sys/kernel/mm/hugepages/*/*``,
  ``nodeN/hugepages/*/{nr,free,surplus}_hugepages``, ``/proc/sys/vm/*``, cgroup v1
  (``hugetlb.2MB.limit_in_bytes``, ``memory.limit_in_bytes``) and v2 (``hugetlb.2MB.max``,
  ``memory.max``) limits;
- ``sysctl`` lines (``vm.nr_hugepages = 1024``), ``uname -r`` / ``uname -a`` /
  ``/proc/version`` (the kernel release), ``/proc/PID/limits`` rows;
- ``numactl -H`` (nodes, their size and free memory to the MiB, cpus, distances), DPDK's
  ``dpdk-hugepages.py -s`` table and SPDK's ``scripts/setup.sh status`` hugepage table;
- a ``kubectl describe pod``'s ``Limits:`` or a pod spec's ``limits:`` (``hugepages-2Mi``,
  ``memory``), which Kubernetes makes the container's cgroup limits.

The forms are read by ``umbp_sim.dump.paste_lines``, line by line. What a paste gives becomes
the files of an in-memory dump (``PasteSource``) that the dump readers read as any other, so
every rule of ``umbp_sim.dump.facts`` applies; each value keeps the paste line it came from
(``PasteFact``). A line in no known form is listed (``Unread``, and a ``paste-unreadable``
note), never fatal; a paste with nothing readable is one ``DumpError``. A value in a known
form that cannot be read (``MemFree: lots kB``, a number beyond 64 bits) is an error naming the
line, as in a dump.

A paste says what it shows and nothing about what it does not: the readers never take a missing
line as evidence (no kernel version from a missing MemAvailable or Hugetlb line, no "kernel
without hugetlb" from missing HugePages lines). What the Machine needs and the paste does not
give is assumed, each time with a note saying what was assumed and the command that settles it.
"""

from __future__ import annotations

import re
from typing import Any

from umbp_sim import _native
from umbp_sim.dump.dump_error import DumpError
from umbp_sim.dump.notes import Note
from umbp_sim.dump.paste_lines import (
    HP_FILE,
    HUGEPAGES,
    LIMITS,
    MEMINFO,
    NODE_FILE,
    NODES,
    GiB,
    KiB,
    MiB,
    PasteFact,
    PasteState,
    Unread,
    read_line,
)
from umbp_sim.dump.source import MemorySource, decode
from umbp_sim.vocabulary.bounded import shown

__all__ = ["PasteFact", "PasteSource", "Unread", "paste_source", "paste_unknowns"]

WRAP_MIN = 40  # the narrowest terminal whose wrapped lines are joined back
# What a paste without MemTotal is assumed to have beside its hugepage pools.
ASSUMED_ORDINARY_MEMORY = 256 * GiB


class PasteSource(MemorySource):
    """The dump a paste stands for; ``facts`` and ``unread`` say which line gave what."""

    paste = True

    def __init__(self, state: PasteState, files: dict[str, bytes], dirs: set[str], name: str):
        super().__init__(files, state.label, name, dirs=dirs)
        self.facts = [state.facts[n] for n in state.order]
        # meminfo lines only: read as a bare meminfo is (one node, no other file)
        self.bare_meminfo = all(f.file == MEMINFO for f in self.facts)
        self.unread = list(state.unread)
        self.notes = list(state.notes)
        self._lines = {f.file: f.line for f in self.facts}

    def at_line(self, e: DumpError) -> DumpError:
        """A reader's error about a file of this dump, said of the paste line that gave it."""
        rel = e.where[len(self.label) + 1 :] if e.where.startswith(self.label + ":") else None
        line = self._lines.get(rel) if rel is not None else None
        if line is None:
            return e
        return DumpError(self.label, e.reason, line, e.kind)


# ---- reading --------------------------------------------------------------------------------


def paste_source(data: bytes, label: str, name: str | None = None) -> PasteSource:
    """The paste ``data`` (named ``label`` in errors; ``name``: the host's name, default the
    file's) as a dump source."""
    text = decode(data, label)
    st = PasteState(label)
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    i = 0
    while i < len(lines):
        raw = lines[i].rstrip()
        n = i + 1
        i += 1
        if not raw.strip():
            st.table = None if st.table != "distances" else st.table
            continue
        if read_line(st, raw, n):
            continue
        # a line the terminal wrapped (at 40 columns or more): it and the next one, joined, in a
        # known form
        wrapped = len(raw) >= WRAP_MIN and i < len(lines) and lines[i].strip()
        if wrapped and _joined(st, raw + lines[i].strip(), n):
            i += 1
            continue
        st.unread.append(Unread(n, raw))
    if st.pod is not None and st.pod.limits and not st.pod.hugepages:
        st.notes.append(Note("pod-limits-cut", f"the pod's limits on line {st.pod.line} end the "
                             "paste: whether they name a hugepages-<size> limit is not shown "
                             "(kubectl get pod -o yaml shows them whole)"))  # fmt: skip
    if not st.facts:
        first = st.unread[0].line if st.unread else None
        raise DumpError(label, _nothing_read(st), first, kind="unreadable")
    if st.unread:
        listed = "; ".join(f"line {u.line} {shown(u.text.strip())}" for u in st.unread[:5])
        more = f" and {len(st.unread) - 5} more" if len(st.unread) > 5 else ""
        st.notes.insert(0, Note("paste-unreadable", f"{len(st.unread)} line(s) of the paste in "
                                f"no form umbp-sim reads, not used: {listed}{more}"))  # fmt: skip
    return _source(st, name or _name(label))


def _joined(st: PasteState, raw: str, n: int) -> bool:
    """Whether two lines joined read as one; a joined line that would be an error is not."""
    try:
        return read_line(st, raw, n)
    except DumpError:
        return False


def _nothing_read(st: PasteState) -> str:
    if not st.unread:
        return "nothing umbp-sim reads in it (only prompts and titles)"
    return (
        f"nothing umbp-sim reads: {len(st.unread)} line(s), none in a form it knows (the "
        f"first: {shown(st.unread[0].text.strip())}); docs/pastes.md lists the forms"
    )


# ---- the dump a paste stands for -------------------------------------------------------------


def _source(st: PasteState, name: str) -> PasteSource:
    files: dict[str, list[str]] = {}
    facts = [st.facts[n] for n in st.order]
    for f in facts:
        if f.file.startswith("numactl:"):
            continue
        if f.file in (MEMINFO, LIMITS) or f.file.endswith("/meminfo"):
            if f.file == LIMITS:
                files.setdefault(LIMITS, ["Limit                     Soft Limit           "
                                          "Hard Limit           Units"])  # fmt: skip
                files[LIMITS].append(f"{f.key:<25} {f.value}")
            elif f.file == MEMINFO:
                files.setdefault(MEMINFO, []).append(f"{f.key}: {f.value}")
            else:
                node = f.file.split("/")[4][4:]
                files.setdefault(f.file, []).append(f"Node {node} {f.key}: {f.value}")
        else:
            files[f.file] = [f.value]
    meminfo = {f.key: f for f in facts if f.file == MEMINFO}
    vm_total = st.facts.get("proc/sys/vm/nr_hugepages")
    if "HugePages_Total" not in meminfo and vm_total is not None:
        # vm.nr_hugepages is the default size's pool, as HugePages_Total is
        files.setdefault(MEMINFO, []).append(f"HugePages_Total: {vm_total.value}")
    _totals_from_free(st, files, vm_total is not None)
    nodes = set(st.node_ids)
    if nodes and st.available is None and max(nodes) + 1 != len(nodes):
        missing = sorted(set(range(max(nodes) + 1)) - nodes)
        st.notes.append(Note("paste-nodes-assumed", "the paste shows node(s) "
                             f"{_ids(sorted(nodes))} but not {_ids(missing)}: taken to exist, "
                             "their memory and pools unknown (numactl -H shows every "
                             "node)"))  # fmt: skip
        nodes |= set(missing)
    if MEMINFO not in files or "MemTotal" not in meminfo:
        files.setdefault(MEMINFO, []).insert(0, f"MemTotal: {_assumed_mem_total(st, nodes)} kB")
    dirs = {f"{NODES}/node{i}" for i in nodes}
    data = {rel: ("\n".join(lines) + "\n").encode() for rel, lines in files.items()}
    return PasteSource(st, data, dirs, name)


def _totals_from_free(st: PasteState, files: dict[str, list[str]], vm_total: bool) -> None:
    """A pool whose free count is shown and its size not holds at least that many pages: a
    global pool is taken as that many (none in use); a node's, when the global count of its
    size is shown, as its free pages plus a share of the pages in use (the global count less
    the free pages shown, spread as the kernel spreads a pool), else as its free pages. Each
    with a note."""
    default = st.facts.get(f"{MEMINFO}:Hugepagesize")
    default_kb = int(default.value.split()[0]) if default else 2048
    by_size: dict[int, list[tuple[int, PasteFact, str]]] = {}  # size kB -> (node, free, total)
    for f in list(st.facts.values()):
        if f.file.endswith("/free_hugepages"):
            total = f.file[: -len("free_hugepages")] + "nr_hugepages"
            if total in st.facts:
                continue
            node = NODE_FILE.search(f.file) if f.file.startswith(NODES) else None
            if node is None:
                files[total] = [f.value]
                _total_note(st, total, f, " (no page in use)")
                continue
            kb = int(HP_FILE.search(f.file).group("kb"))  # type: ignore[union-attr]
            by_size.setdefault(kb, []).append((int(node.group("node")), f, total))
        elif f.key == "HugePages_Free" and f"{f.file}:HugePages_Total" not in st.facts:
            if f.file == MEMINFO:
                if not vm_total:
                    files[MEMINFO].append(f"HugePages_Total: {f.value}")
                    _total_note(st, f"{MEMINFO}:HugePages_Total", f, " (no page in use)")
                continue
            node_id = int(f.file.split("/")[4][4:])
            by_size.setdefault(default_kb, []).append((node_id, f, f"{f.file}:HugePages_Total"))
    for kb, shown_free in sorted(by_size.items()):
        glob = st.facts.get(f"{HUGEPAGES}/hugepages-{kb}kB/nr_hugepages")
        if glob is None and kb == default_kb:
            glob = st.facts.get(f"{MEMINFO}:HugePages_Total") or st.facts.get(
                "proc/sys/vm/nr_hugepages"
            )
        shown_free.sort(key=lambda x: x[0])
        used = 0
        if glob is not None:
            used = max(0, int(glob.value) - sum(int(f.value) for _, f, _ in shown_free))
        shares = _native.interleave(used, len(shown_free))
        for (node_id, f, total), share in zip(shown_free, shares, strict=True):
            pages = int(f.value) + share
            if total.endswith(":HugePages_Total"):
                files[total[: -len(":HugePages_Total")]].append(
                    f"Node {node_id} HugePages_Total: {pages}"
                )
            else:
                files[total] = [str(pages)]
            how = " (no page in use)" if glob is None else (
                f" plus {share} of the {used} pages in use (the global count on line "
                f"{glob.line} less the free pages shown, spread as the kernel spreads a pool)"
            )  # fmt: skip
            _total_note(st, total, f, how, pages)


def _total_note(
    st: PasteState, total: str, free: PasteFact, how: str, pages: int | None = None
) -> None:
    pages = int(free.value) if pages is None else pages
    st.notes.append(Note("pool-total-assumed", f"{total} is not in the paste: taken as {pages}, "
                         f"the free count on line {free.line}{how}"))  # fmt: skip


def _ids(ids: list[int]) -> str:
    return ",".join(str(i) for i in ids)


def _assumed_mem_total(st: PasteState, nodes: set[int]) -> int:
    """MemTotal (kB) for a paste without the line: the nodes' sum when every node's size is
    given (numactl -H), else the hugepage pools plus ASSUMED_ORDINARY_MEMORY; noted."""
    sizes = {i: st.facts.get(f"{NODES}/node{i}/meminfo:MemTotal") for i in sorted(nodes)}
    if nodes and all(sizes.values()):
        kb = sum(int(f.value.split()[0]) for f in sizes.values() if f is not None)
        st.notes.append(Note("memory-assumed", f"MemTotal is not in the paste: the nodes' sum, "
                             f"{kb} kB (numactl -H gives them to the MiB)"))  # fmt: skip
        return kb
    pools = _pool_bytes(st)
    kb = (pools + ASSUMED_ORDINARY_MEMORY) // KiB
    st.notes.append(Note("memory-assumed", f"MemTotal is not in the paste: assumed {kb} kB (the "
                         f"hugepage pools shown, {pools // KiB} kB, plus "
                         f"{ASSUMED_ORDINARY_MEMORY // GiB} GiB), so ordinary memory is not what "
                         "limits a replay; `grep -E 'MemTotal|MemFree|MemAvailable' /proc/meminfo` "
                         "settles it"))  # fmt: skip
    return kb


def _pool_bytes(st: PasteState) -> int:
    """The bytes of the hugepage pools the paste shows (each size: the larger of its global
    count and its nodes' sum)."""
    per_size: dict[int, tuple[int, int]] = {}  # size -> (global, nodes' sum)
    default = st.facts.get(f"{MEMINFO}:Hugepagesize")
    default_size = int(default.value.split()[0]) * KiB if default else 2 * MiB
    for f in st.facts.values():
        m = HP_FILE.search(f.file)
        if m and m.group("file") == "nr_hugepages":
            size = int(m.group("kb")) * KiB
            g, s = per_size.get(size, (0, 0))
            if f.file.startswith(NODES):
                per_size[size] = (g, s + int(f.value))
            else:
                per_size[size] = (max(g, int(f.value)), s)
        elif f.key == "HugePages_Total" or f.file == "proc/sys/vm/nr_hugepages":
            g, s = per_size.get(default_size, (0, 0))
            if f.file == MEMINFO or f.file.startswith("proc/"):
                per_size[default_size] = (max(g, int(f.value)), s)
            else:
                per_size[default_size] = (g, s + int(f.value.split()[0]))
    return sum(size * max(g, s) for size, (g, s) in per_size.items())


def _name(label: str) -> str:
    return label.rsplit("/", 1)[-1] or label


def paste_unknowns(src: Any, f: Any) -> None:  # (PasteSource, DumpFacts)
    """Keep the paste's lines in ``f`` and note what the readers took for what it does not show:
    a pool's free count, the limits."""
    f.paste_facts = list(src.facts)
    f.paste_unread = list(src.unread)
    names = [p.name for p in src.facts]
    for size in sorted(f.hugepages):
        d = f"hugepages-{size // KiB}kB/"
        default = size == f.default_hugepage_size
        total = any(d + "nr_hugepages" in n for n in names) or (
            default and any(n.endswith((":HugePages_Total", "vm/nr_hugepages")) for n in names)
        )
        free = any(d + "free_hugepages" in n for n in names) or (
            default and any(n.endswith(":HugePages_Free") for n in names)
        )
        if total and not free:
            f.note("pool-free-assumed", f"{size // KiB} kB pages: the paste gives the pool's "
                   "size, not how many pages are free: taken as all free (HugePages_Free, or "
                   "the nodes' free_hugepages, settles it)")  # fmt: skip
    if not any(n.startswith(("sys/fs/cgroup/", LIMITS)) for n in names):
        f.note("limits-assumed", "no cgroup or process limit in the paste: none assumed "
               "(memory.max, hugetlb.<size>.max, RLIMIT_AS); in the server's container, `grep . "
               "/sys/fs/cgroup/memory.max /sys/fs/cgroup/hugetlb.*.max` settles it")  # fmt: skip


_POD_HUGEPAGES_ROW = re.compile(r"\bhugepages-\d+(?:Ki|Mi|Gi)\s*:")


def pod_hugetlb_limits(f: Any) -> bool:  # (DumpFacts)
    """Whether the hugetlb limits of the dump ``f`` are a Kubernetes pod's (its limits pasted:
    a ``hugepages-<size>`` row, or none and Kubernetes' 0): the fix is in its spec."""
    if any(n.code == "pod-no-hugepages" for n in f.notes):
        return True
    return any(
        p.file.startswith("sys/fs/cgroup/hugetlb.") and _POD_HUGEPAGES_ROW.search(p.text)
        for p in f.paste_facts
    )
