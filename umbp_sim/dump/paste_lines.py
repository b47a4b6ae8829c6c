"""The forms of a paste, line by line (``umbp_sim.dump.paste`` reads a paste with them).

``read_line(state, raw, n)`` reads one line into ``PasteState``: what it gives as ``PasteFact``
(the dump file it stands for, the value as that file holds it, the line), the tables and the
``cat FILE`` prompt it opens for the lines after it. A line in no known form returns False. The
forms, with examples, are in docs/pastes.md; each value in a known form is checked as a dump's
is (``umbp_sim.dump.parse``), and one that cannot be read is a ``DumpError`` naming the line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from umbp_sim.collect_scripts.standalone_collect import VM_SYSCTLS
from umbp_sim.dump.dump_error import DumpError
from umbp_sim.dump.notes import Note
from umbp_sim.dump.parse import (
    MAX_NODES,
    MEMINFO_COUNT_KEYS,
    MEMINFO_KB_KEYS,
    NODE_MEMINFO_COUNT_KEYS,
    NODE_MEMINFO_KB_KEYS,
    _kv_value,
    _number,
)
from umbp_sim.vocabulary.bounded import shown
from umbp_sim.vocabulary.units import cgroup_hugetlb_name
from umbp_sim.vocabulary.value_types import MAX_BYTES

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
MEMINFO = "proc/meminfo"
NODES = "sys/devices/system/node"
HUGEPAGES = "sys/kernel/mm/hugepages"
OSRELEASE = "proc/sys/kernel/osrelease"
LIMITS = "proc/self/limits"
# cgroup v1 prints "no limit" as PAGE_COUNTER_MAX pages: LONG_MAX rounded down to a page.
V1_UNLIMITED = (1 << 63) - (1 << 16)

# ---- the forms ------------------------------------------------------------------------------

_PROMPT = re.compile(
    r"^\s*(?:\[[^\]\n]{1,200}\]\s?[#$]|[\w.-]{1,64}@[\w.-]{1,253}(?::\S{0,300})?\s?[#$]|"
    r"[\w.-]{1,64}:\S{0,300}\s?[#$]|[~/]\S{0,300}\s[#$]|[#$%>])\s+(?P<cmd>.*)$"
)
_MEMINFO = re.compile(r"^(?P<key>[A-Za-z][A-Za-z0-9_()]*):\s*(?P<value>.*)$", re.ASCII)
_NODE_MEMINFO = re.compile(
    r"^Node\s+(?P<node>\d{1,7})\s+(?P<key>[A-Za-z][A-Za-z0-9_()]*):\s*(?P<value>.*)$", re.ASCII
)
_MEMINFO_VALUE = re.compile(r"^\d+(?:\s+kB)?$", re.ASCII)
_PATH_VALUE = re.compile(r"^(?P<path>[^\s:]*[/.][^\s:]*):(?P<rest>.*)$")
_SYSCTL = re.compile(r"^(?P<key>(?:vm|kernel)\.[a-z_.]+)\s*=\s*(?P<value>\S+)$", re.ASCII)
_RELEASE = re.compile(r"^[2-9]\.[0-9]{1,3}\.[0-9]{1,5}[A-Za-z0-9._+~-]{0,120}$", re.ASCII)
_PROC_VERSION = re.compile(r"^Linux version (?P<release>[0-9]+\.[0-9]+\S*)")
_UNAME_A = re.compile(r"^Linux \S+ (?P<release>[0-9]+\.[0-9]+\.[0-9]+\S*) #")
_NUMACTL_AVAILABLE = re.compile(r"^available:\s+(\d+)\s+nodes?\s+\((?P<list>[0-9,\s-]*)\)$")
_NUMACTL_NODE = re.compile(r"^node\s+(?P<node>\d{1,7})\s+(?P<what>cpus|size|free):\s*(?P<v>.*)$")
_NUMACTL_MB = re.compile(r"^(\d{1,15})\s+MB$")
_DISTANCE_HEAD = re.compile(r"^node(?:\s+\d{1,7})+$")
_DISTANCE_ROW = re.compile(r"^(?P<node>\d{1,7}):(?P<row>(?:\s+\d{1,5})+)$")
_DPDK_HEAD = re.compile(r"^(?:Node\s+)?Pages\s+Size\s+Total$")
_DPDK_SIZE = r"(\d{1,12})([KMG])b"
_DPDK_NUMA_ROW = re.compile(rf"^(?P<node>\d{{1,7}})\s+(?P<pages>\d{{1,20}})\s+{_DPDK_SIZE}\s+\S+$")
_DPDK_ROW = re.compile(rf"^(?P<pages>\d{{1,20}})\s+{_DPDK_SIZE}\s+\S+$")
_SPDK_HEAD = re.compile(r"^node\s+hugesize\s+free\s+/\s+total$")
_SPDK_ROW = re.compile(
    r"^(?:node(?P<node>\d{1,7})|-)\s+(?P<kb>\d{1,15})(?:kB)?\s+(?P<free>\d{1,20})\s+/\s+"
    r"(?P<total>\d{1,20})$"
)
_SPDK_DEVICES_HEAD = re.compile(r"^Type\s+BDF\s+Vendor\s+Device\b")
_LIMITS_HEAD = re.compile(r"^Limit\s+Soft Limit\s+Hard Limit(?:\s+Units)?$")
_LIMITS_ROW = re.compile(
    r"^(?P<name>Max [a-z ]+?)\s+(?P<soft>unlimited|\d{1,20})\s+(?P<hard>unlimited|\d{1,20})"
    r"(?:\s+(?P<unit>[a-z]+))?$"
)
_CPUS = re.compile(r"^[0-9 ]*$")
_POD_HEAD = re.compile(r"^(?P<indent>\s*)(?P<what>Limits|limits|Requests|requests):\s*$")
_POD_ROW = re.compile(
    r'^"?(?P<key>[A-Za-z0-9./_-]{1,100})"?:\s+"?(?P<value>[0-9.]+[A-Za-z]{0,2})"?,?$'
)
_NUMBER = re.compile(r"^\d{1,25}$")
# Lines known to carry nothing umbp-sim reads (titles, mount lines of the tables above).
_NOTHING = re.compile(
    r"^(?:Hugepages|node distances:|Hugepages mounted on\b.*|Huge page filesystems mounted at:.*"
    r"|No huge page filesystems mounted|Hugepages not mounted|No NUMA available on this system"
    r"|No huge pages reserved"
    r"|```[\w+-]*|~~~[\w+-]*)$"  # a ticket's code fences
)

NODE_FILE = re.compile(r"(?:^|/)node(?P<node>\d{1,7})/(?P<rest>.+)$")
HP_FILE = re.compile(
    r"(?:^|/)hugepages-(?P<kb>\d{1,15})kB/(?P<file>nr_hugepages|free_hugepages|resv_hugepages|"
    r"surplus_hugepages|nr_overcommit_hugepages|nr_hugepages_mempolicy)$"
)
_VM_FILE = re.compile(r"(?:^|/)(?:proc/)?sys/vm/(?P<key>[a-z_]+)$")
_CGROUP_HUGETLB = re.compile(
    r"(?:^|/)hugetlb\.(?P<size>\d{1,12}(?:KB|MB|GB|TB))\.(?P<what>max|rsvd\.max|limit_in_bytes|"
    r"rsvd\.limit_in_bytes|current|rsvd\.current|usage_in_bytes|max_usage_in_bytes|events|"
    r"failcnt|rsvd\.usage_in_bytes|rsvd\.max_usage_in_bytes|rsvd\.failcnt|numa_stat)$"
)
_CGROUP_MEMORY = re.compile(r"(?:^|/)memory\.(?P<what>max|limit_in_bytes)$")


@dataclass(frozen=True)
class PasteFact:
    """One value a paste gives: the dump file it stands for (``key``: its line inside a
    multi-line file, as ``MemTotal``), the value as that file holds it, and the paste line."""

    file: str
    key: str | None
    value: str
    line: int
    text: str

    @property
    def name(self) -> str:
        return self.file if self.key is None else f"{self.file}:{self.key}"

    def to_json(self) -> dict[str, Any]:
        return {"fact": self.name, "value": self.value, "line": self.line, "text": self.text}


@dataclass(frozen=True)
class Unread:
    """A paste line in no form umbp-sim reads."""

    line: int
    text: str

    def to_json(self) -> dict[str, Any]:
        return {"line": self.line, "text": self.text}


@dataclass
class _PodBlock:
    """A ``Limits:`` (kubectl describe pod) or ``limits:`` (a pod spec) block: its header's
    indent and line, and whether it named a hugepages-<size> limit."""

    indent: int
    line: int
    text: str
    limits: bool
    hugepages: bool = False


@dataclass
class PasteState:
    label: str
    facts: dict[str, PasteFact] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    unread: list[Unread] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    node_ids: set[int] = field(default_factory=set)
    available: list[int] | None = None
    context: str | None = None  # the file a `cat FILE` prompt line announced
    table: str | None = None  # dpdk / dpdk-numa / spdk / spdk-devices / distances
    distance_cols: list[int] = field(default_factory=list)
    last_cpus: int | None = None
    pod: _PodBlock | None = None  # a pod's Limits:/Requests: block being read
    read_lines: int = 0
    known_lines: int = 0  # lines in a known form with nothing to read (titles, prompts)

    def add(self, file: str, key: str | None, value: str, line: int, text: str) -> None:
        fact = PasteFact(file, key, value, line, text)
        old = self.facts.get(fact.name)
        if old is not None and old.value != value:
            self.notes.append(Note("paste-repeated", f"{fact.name} is given twice, {old.value} "
                                   f"on line {old.line} and {value} on line {line}: line "
                                   f"{line}'s is used"))  # fmt: skip
        if old is None:
            self.order.append(fact.name)
        self.facts[fact.name] = fact
        node = NODE_FILE.search(file) if file.startswith(NODES) else None
        if node:
            self.node_ids.add(int(node.group("node")))


def read_line(st: PasteState, raw: str, n: int) -> bool:
    """Read one line (or two joined); False when it is in no known form."""
    line = raw.strip()
    if st.pod is not None:
        if _indent(raw) > st.pod.indent:
            return _pod_row(st, line, raw, n)
        _end_pod_block(st)
    m = _POD_HEAD.match(raw)
    if m:
        st.pod = _PodBlock(len(m.group("indent")), n, raw, m.group("what").lower() == "limits")
        st.known_lines += 1
        return True
    m = _PROMPT.match(raw)
    if m:
        st.context = _command_context(m.group("cmd").strip())
        st.table = None
        st.known_lines += 1
        return True
    if st.context is not None and _context_value(st, line, raw, n):
        return True
    if _table_row(st, line, raw, n):
        return True
    if _NOTHING.match(line):
        if line == "node distances:":
            st.table = "distances"
        st.known_lines += 1
        return True
    for head, table in ((_DPDK_HEAD, "dpdk"), (_SPDK_HEAD, "spdk"), (_LIMITS_HEAD, "limits"),
                        (_SPDK_DEVICES_HEAD, "spdk-devices")):  # fmt: skip
        if head.match(line):
            st.table = "dpdk-numa" if table == "dpdk" and line.startswith("Node") else table
            st.known_lines += 1
            return True
    return _self_describing(st, line, raw, n)


def _indent(raw: str) -> int:
    return len(raw) - len(raw.lstrip())


def _pod_row(st: PasteState, line: str, raw: str, n: int) -> bool:
    """A row of a pod's Limits/Requests: ``hugepages-2Mi: 4Gi`` is the hugetlb cgroup limit
    Kubernetes sets for the container, ``memory: 64Gi`` its memory.max; requests only
    repeat them (Kubernetes wants hugepage requests equal to limits)."""
    m = _POD_ROW.match(line)
    pod = st.pod
    assert pod is not None
    if not m:
        return False
    key, value = m.group("key"), m.group("value")
    if not pod.limits:
        st.known_lines += 1
        return True
    hp = re.fullmatch(r"hugepages-(\d{1,6})(Ki|Mi|Gi)", key)
    if hp is None and key != "memory":
        st.known_lines += 1  # cpu, GPUs, ephemeral storage
        return True
    limit = _quantity(value)
    if limit is None:
        return False
    if hp is not None:
        size = int(hp.group(1)) << {"Ki": 10, "Mi": 20, "Gi": 30}[hp.group(2)]
        _check_size(st, size, n)
        pod.hugepages = True
        st.add(f"sys/fs/cgroup/hugetlb.{cgroup_hugetlb_name(size)}.max", None, str(limit), n, raw)
    else:
        st.add("sys/fs/cgroup/memory.max", None, str(limit), n, raw)
    st.read_lines += 1
    return True


def _end_pod_block(st: PasteState) -> None:
    """A pod's limits read whole: Kubernetes gives every hugepage size the pod does not name a
    hugetlb limit of 0 (a hugepage fault there is a SIGBUS)."""
    pod = st.pod
    st.pod = None
    if pod is None or not pod.limits or pod.hugepages:
        return
    for size in (2 * MiB, GiB):
        name = f"sys/fs/cgroup/hugetlb.{cgroup_hugetlb_name(size)}.max"
        st.add(name, None, "0", pod.line, pod.text)
    st.notes.append(Note("pod-no-hugepages", f"the pod's limits on line {pod.line} name no "
                         "hugepages-<size>: Kubernetes sets its hugetlb limits to 0, so a "
                         "hugepage fault in it is a SIGBUS (resources.limits.hugepages-2Mi in "
                         "the pod spec sets one)"))  # fmt: skip


_QUANTITY_SUFFIX = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50,
                    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}  # fmt: skip


def _quantity(text: str) -> int | None:
    """A Kubernetes quantity (``4Gi``, ``512Mi``, ``100G``, ``1073741824``) in bytes."""
    m = re.fullmatch(r"(\d{1,15})(?:\.(\d{1,9}))?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?", text)
    if m is None:
        return None
    scale = _QUANTITY_SUFFIX.get(m.group(3) or "", 1)
    frac = m.group(2) or ""
    value = (int(m.group(1) + frac) * scale) // 10 ** len(frac)
    return value if value < MAX_BYTES else None


def _command_context(cmd: str) -> str | None:
    """The file whose value the lines after a prompt line hold: ``cat FILE`` with one file,
    ``sysctl -n vm.KEY``, ``uname -r``; None for any other command."""
    words = cmd.split()
    while words and words[0] in ("sudo", "command", "builtin"):
        words = words[1:]
    if len(words) == 2 and words[0] == "cat" and "*" not in words[1] and "?" not in words[1]:
        return _file_of(words[1])
    if len(words) == 3 and words[:2] == ["sysctl", "-n"]:
        key = words[2].replace("/", ".")
        if key.startswith("vm."):
            return f"proc/sys/vm/{key[3:]}"
        if key == "kernel.osrelease":
            return OSRELEASE
    if words == ["uname", "-r"]:
        return OSRELEASE
    return None


def _file_of(path: str) -> str | None:
    """The dump file a path names (a dump-root-relative path), or None."""
    m = HP_FILE.search(path)
    if m:
        node = NODE_FILE.search(path)
        d = f"hugepages-{m.group('kb')}kB/{m.group('file')}"
        if node and "hugepages/" in node.group("rest"):
            return f"{NODES}/node{node.group('node')}/hugepages/{d}"
        return f"{HUGEPAGES}/{d}"
    m = _VM_FILE.search(path)
    if m:
        return f"proc/sys/vm/{m.group('key')}"
    m = _CGROUP_HUGETLB.search(path)
    if m:
        return f"cgroup:hugetlb.{m.group('size')}.{m.group('what')}"
    m = _CGROUP_MEMORY.search(path)
    if m:
        return f"cgroup:memory.{m.group('what')}"
    node = NODE_FILE.search(path)
    if node and node.group("rest") in ("meminfo", "cpulist", "distance"):
        return f"{NODES}/node{node.group('node')}/{node.group('rest')}"
    if re.search(r"(?:^|/)sys/devices/system/node/(online|possible|has_memory)$", path):
        return f"{NODES}/{path.rsplit('/', 1)[1]}"
    if path.endswith(("proc/meminfo",)) or path == "meminfo":
        return MEMINFO
    if path.endswith(("sys/kernel/osrelease",)):
        return OSRELEASE
    if path.endswith("proc/version"):
        return "proc/version"
    if re.search(r"(?:^|/)proc/(?:self|\d+)/limits$", path):
        return LIMITS
    return None


def _context_value(st: PasteState, line: str, raw: str, n: int) -> bool:
    """A line after ``cat FILE``: FILE's value (multi-line files read their lines as usual)."""
    ctx = st.context
    assert ctx is not None
    if ctx in (MEMINFO, LIMITS, "proc/version") or ctx.endswith("/meminfo"):
        return False  # their lines say what they are
    if ctx == OSRELEASE:
        if _RELEASE.match(line) or re.match(r"^[0-9]+\.[0-9]+", line):
            st.add(OSRELEASE, None, line, n, raw)
            st.read_lines += 1
            st.context = None
            return True
        return False
    if _file_value(st, ctx, line, raw, n):
        st.context = None  # a one-value file: the lines after it are something else
        return True
    return False


def _file_value(st: PasteState, file: str, value: str, raw: str, n: int) -> bool:
    """``value`` for the one-value ``file`` (a dump path, or ``cgroup:NAME``)."""
    value = value.strip()
    if file.startswith("cgroup:"):
        return _cgroup_value(st, file[7:], value, raw, n)
    if file.endswith(("/online", "/possible", "/has_memory", "/cpulist")):
        if re.match(r"^[0-9,\s-]*$", value):
            st.add(file, None, value, n, raw)
            st.read_lines += 1
            return True
        return False
    if file.endswith("/distance"):
        if re.match(r"^[0-9 ]+$", value):
            st.add(file, None, value, n, raw)
            st.read_lines += 1
            return True
        return False
    if not _NUMBER.match(value):
        return False
    if file.startswith("proc/sys/vm/") and file[12:] not in VM_SYSCTLS:
        st.known_lines += 1  # a vm sysctl umbp-sim does not model
        return True
    if file.endswith("/nr_hugepages_mempolicy"):
        st.known_lines += 1  # the same count as nr_hugepages, for the caller's mempolicy
        return True
    number = _number(value, st.label, n, file.rsplit("/", 1)[-1])
    if file == "proc/sys/vm/overcommit_memory" and number not in (0, 1, 2):
        raise DumpError(st.label, f"vm.overcommit_memory {number} is not 0, 1 or 2", n)
    _check_size_dir(st, file, n)
    st.add(file, None, str(number), n, raw)
    st.read_lines += 1
    return True


def _check_size_dir(st: PasteState, file: str, n: int) -> None:
    m = HP_FILE.search(file)
    if m:
        _check_size(st, int(m.group("kb")) * KiB, n)


def _check_size(st: PasteState, size: int, n: int) -> None:
    if size <= 4 * KiB or size & (size - 1):
        raise DumpError(st.label, f"hugepage size {size // KiB} kB is not a power of two larger "
                        "than a base page", n)  # fmt: skip


def _cgroup_value(st: PasteState, name: str, value: str, raw: str, n: int) -> bool:
    if value != "max" and not _NUMBER.match(value):
        return False
    m = _CGROUP_HUGETLB.search(name)
    if m and m.group("what") in ("max", "rsvd.max", "limit_in_bytes", "rsvd.limit_in_bytes"):
        limit = value if value == "max" else _number(value, st.label, n, name)
        if isinstance(limit, int) and m.group("what").endswith("limit_in_bytes"):
            limit = "max" if limit >= V1_UNLIMITED else limit  # v1's "no limit"
        size = _cgroup_size(m.group("size"))
        _check_size(st, size, n)
        rsvd = ".rsvd" if m.group("what").startswith("rsvd") else ""
        st.add(f"sys/fs/cgroup/hugetlb.{cgroup_hugetlb_name(size)}{rsvd}.max", None, str(limit),
               n, raw)  # fmt: skip
        st.read_lines += 1
        return True
    m2 = _CGROUP_MEMORY.search(name)
    if m2:
        limit = value if value == "max" else _number(value, st.label, n, name)
        if isinstance(limit, int) and m2.group("what") == "limit_in_bytes":
            limit = "max" if limit >= V1_UNLIMITED else limit
        st.add("sys/fs/cgroup/memory.max", None, str(limit), n, raw)
        st.read_lines += 1
        return True
    st.known_lines += 1  # usage, events, failcnt: not modelled
    return True


def _cgroup_size(name: str) -> int:
    return int(name[:-2]) << {"KB": 10, "MB": 20, "GB": 30, "TB": 40}[name[-2:]]


def _table_row(st: PasteState, line: str, raw: str, n: int) -> bool:
    """A row of the table whose header came last (numactl's distances, DPDK's, SPDK's)."""
    t = st.table
    if t == "distances":
        if _DISTANCE_HEAD.match(line):
            st.distance_cols = [int(x) for x in line.split()[1:]]
            st.known_lines += 1
            return True
        m = _DISTANCE_ROW.match(line)
        if m and st.distance_cols and len(m.group("row").split()) == len(st.distance_cols):
            by_col = dict(zip(st.distance_cols, m.group("row").split(), strict=True))
            row = " ".join(by_col[c] for c in sorted(by_col))
            st.add(f"{NODES}/node{int(m.group('node'))}/distance", None, row, n, raw)
            st.read_lines += 1
            return True
        return False
    if t in ("dpdk", "dpdk-numa"):
        m = (_DPDK_NUMA_ROW if t == "dpdk-numa" else _DPDK_ROW).match(line)
        if not m:
            return False
        size = (
            int(m.group(3 if t == "dpdk-numa" else 2))
            << {"K": 10, "M": 20, "G": 30}[m.group(4 if t == "dpdk-numa" else 3)]
        )
        _check_size(st, size, n)
        pages = str(_number(m.group("pages"), st.label, n, "Pages"))
        d = f"hugepages-{size // KiB}kB/nr_hugepages"
        node = f"{NODES}/node{int(m.group('node'))}/hugepages/" if t == "dpdk-numa" else None
        st.add(f"{node}{d}" if node else f"{HUGEPAGES}/{d}", None, pages, n, raw)
        st.read_lines += 1
        return True
    if t == "spdk":
        m = _SPDK_ROW.match(line)
        if not m:
            return False
        size = int(m.group("kb")) * KiB
        _check_size(st, size, n)
        base = (
            f"{NODES}/node{int(m.group('node'))}/hugepages"
            if m.group("node") is not None
            else HUGEPAGES
        )
        for file, key in (("free_hugepages", "free"), ("nr_hugepages", "total")):
            value = str(_number(m.group(key), st.label, n, file))
            st.add(f"{base}/hugepages-{size // KiB}kB/{file}", None, value, n, raw)
        st.read_lines += 1
        return True
    if t == "spdk-devices":
        st.known_lines += 1  # the device rows: nothing about memory
        return True
    if t == "limits":
        return _limits_row(st, line, raw, n)
    return False


def _limits_row(st: PasteState, line: str, raw: str, n: int) -> bool:
    m = _LIMITS_ROW.match(line)
    if not m:
        return False
    for v in (m.group("soft"), m.group("hard")):
        if v != "unlimited":
            _number(v, st.label, n, m.group("name"))
    cells = f"{m.group('soft'):<20} {m.group('hard'):<20} {m.group('unit') or ''}".rstrip()
    st.add(LIMITS, m.group("name"), cells, n, raw)
    st.read_lines += 1
    return True


def _self_describing(st: PasteState, line: str, raw: str, n: int) -> bool:
    """A line that says what it is: ``path:value``, meminfo, sysctl, numactl, a release."""
    m = _PATH_VALUE.match(line)
    if m:
        file = _file_of(m.group("path"))
        if file is not None:
            rest = m.group("rest").strip()
            if file == MEMINFO or file.endswith("/meminfo"):
                return _meminfo_line(st, rest, raw, n)
            if file == LIMITS:
                return _limits_row(st, rest, raw, n)
            if file == OSRELEASE and _RELEASE.match(rest):
                st.add(OSRELEASE, None, rest, n, raw)
                st.read_lines += 1
                return True
            return _file_value(st, file, rest, raw, n)
    if _meminfo_line(st, line, raw, n):
        return True
    m = _SYSCTL.match(line)
    if m:
        key, value = m.group("key"), m.group("value")
        if key == "kernel.osrelease":
            st.add(OSRELEASE, None, value, n, raw)
            st.read_lines += 1
            return True
        if key.startswith("vm.") and "." not in key[3:]:
            return _file_value(st, f"proc/sys/vm/{key[3:]}", value, raw, n)
        st.known_lines += 1
        return True
    if _numactl(st, line, raw, n):
        return True
    if st.last_cpus is not None and _CPUS.match(line):  # numactl's cpus line, wrapped
        st.known_lines += 1
        return True
    for pattern in (_PROC_VERSION, _UNAME_A):
        m = pattern.match(line)
        if m:
            st.add(OSRELEASE, None, m.group("release"), n, raw)
            st.read_lines += 1
            return True
    if _RELEASE.match(line):  # uname -r's output without its prompt
        st.add(OSRELEASE, None, line, n, raw)
        st.read_lines += 1
        return True
    if _LIMITS_ROW.match(line):
        return _limits_row(st, line, raw, n)
    return False


def _meminfo_line(st: PasteState, line: str, raw: str, n: int) -> bool:
    m = _NODE_MEMINFO.match(line)
    if m:
        node, key, value = int(m.group("node")), m.group("key"), m.group("value").strip()
        if not _MEMINFO_VALUE.match(value):
            return False
        if node >= MAX_NODES:
            raise DumpError(st.label, f"node id {node} >= {MAX_NODES}", n)
        if key in NODE_MEMINFO_KB_KEYS + NODE_MEMINFO_COUNT_KEYS:
            _kv_value(key, " " + value, st.label, n, NODE_MEMINFO_KB_KEYS)
            st.add(f"{NODES}/node{node}/meminfo", key, value, n, raw)
            st.read_lines += 1
        else:
            st.node_ids.add(node)
            st.known_lines += 1
        return True
    m = _MEMINFO.match(line)
    if not m:
        return False
    key, value = m.group("key"), m.group("value").strip()
    if key in MEMINFO_KB_KEYS + MEMINFO_COUNT_KEYS:
        number = _kv_value(key, " " + value, st.label, n, MEMINFO_KB_KEYS)
        if key == "Hugepagesize":
            _check_size(st, number, n)
        st.add(MEMINFO, key, value, n, raw)
        st.read_lines += 1
        return True
    if _MEMINFO_VALUE.match(value):
        st.known_lines += 1  # a meminfo line umbp-sim does not use (Buffers, AnonHugePages...)
        return True
    return False


def _numactl(st: PasteState, line: str, raw: str, n: int) -> bool:
    m = _NUMACTL_AVAILABLE.match(line)
    if m:
        ids: list[int] = []
        for part in m.group("list").replace(" ", "").split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or not (hi or lo).isdigit():
                return False
            if len(hi or lo) > 7 or int(hi or lo) >= MAX_NODES:
                raise DumpError(st.label, f"node id {shown(hi or lo)} >= {MAX_NODES}", n)
            ids += range(int(lo), int(hi or lo) + 1)
        st.available = ids
        st.node_ids.update(ids)
        st.add("numactl:available", None, ",".join(map(str, ids)), n, raw)
        st.read_lines += 1
        return True
    m = _NUMACTL_NODE.match(line)
    if not m:
        return False
    node, what, v = int(m.group("node")), m.group("what"), m.group("v").strip()
    if node >= MAX_NODES:
        raise DumpError(st.label, f"node id {node} >= {MAX_NODES}", n)
    st.last_cpus = node if what == "cpus" else None
    if what == "cpus":
        if not _CPUS.match(v):
            return False
        st.add(f"{NODES}/node{node}/cpulist", None, ",".join(v.split()), n, raw)
    else:
        mb = _NUMACTL_MB.match(v)
        if not mb:
            return False
        kb = _number(mb.group(1), st.label, n, f"node {node} {what}") * 1024
        key = "MemTotal" if what == "size" else "MemFree"
        st.add(f"{NODES}/node{node}/meminfo", key, f"{kb} kB", n, raw)
    st.read_lines += 1
    return True
