#!/usr/bin/env python3
"""umbp-sim's host collector, stand-alone: the system's python3 (3.6 or later), stdlib only.

    python3 collect.py [-o FILE.tar.gz] [--name NAME] [--pid PID]

Writes the tarball ``umbp-sim collect`` writes (``umbp-sim replay FILE`` reads it): /proc/meminfo,
the vm sysctls, the kernel release, the limits, /sys/kernel/mm/hugepages, the NUMA nodes, the
effective cgroup limits and the files left in hugetlbfs mounts (``umbp-sim-hugetlbfs.tsv``: each
with the kB it holds), under ``NAME/``, with ``NAME/umbp-sim-collect.json`` listing what was
collected, what was missing and why, and what was left out, and recording the architecture
(``machine``: ``uname -m``) and the base page size (``page_size``: ``sysconf(_SC_PAGESIZE)``).

``--pid PID``: the limits, cgroup and NUMA policy are the ones that process saw (its
/proc/PID/limits, /proc/PID/cgroup, the Mems_allowed lines of /proc/PID/status and its
numa_maps without file names), not this script's. Never read: environment variables
(/proc/*/environ) and command lines (/proc/*/cmdline), of any process.

``-o FILE`` writes a new file or replaces a regular one (atomically: a new file moved into
place); a symbolic link, a directory, a device, a FIFO or a socket there is refused before any
collecting. ``-o -`` writes the tarball (gzip) to stdout, unless stdout is a terminal.

Exit 0 written, 64 bad usage, 73 the output cannot be written (or is refused). Nothing else is
fatal.

umbp_sim/live_dump.py (``umbp-sim collect``) imports Collector, collect_host, cgroup_limits,
host_arch, add_manifest, check_output, tar_bytes and write_output from this file: one
implementation for both collectors.
"""

import errno
import io
import json
import os
import re
import stat
import sys
import tarfile
import tempfile
import time

PROG = "collect.py"
TOOL = "umbp-sim collect.py"
MANIFEST = "umbp-sim-collect.json"
# A v1 limit at or above this is "no limit" (PAGE_COUNTER_MAX * PAGE_SIZE is just below 2**63).
V1_UNLIMITED = 1 << 62
MAX_READ = 4 << 20
STATUS_KEYS = ("Mems_allowed", "Mems_allowed_list", "Cpus_allowed", "Cpus_allowed_list")
# The server's credentials (--pid only), kept as proc/self/status: whether it had
# CAP_SYS_ADMIN / CAP_SYS_NICE decides the admin reserve and MPOL_MF_MOVE_ALL.
CREDENTIAL_KEYS = ("Uid", "Gid", "CapPrm", "CapEff", "CapBnd")
NUMA_TOKEN = re.compile(
    r"^(?:N[0-9]+|anon|dirty|active|mapped|mapmax|swapcache|writeback|kernelpagesize_kB)="
    r"[0-9]+$|^(?:huge|heap|stack)$"
)
USAGE = "usage: collect.py [-o FILE.tar.gz] [--name NAME] [--pid PID]"
# sysexits.h, as umbp_sim/vocabulary/exit_codes.py declares them (this file cannot import umbp_sim;
# tests/test_package_fit.py checks they agree).
EX_USAGE = 64
EX_CANTCREAT = 73

# ---- the files of a dump: declared once --------------------------------------------------------
# What both collectors gather and umbp_sim.dump reads: the reader (dump/read_system.py) and a
# sosreport's sysctl lines (dump/sosreport.py) take these lists from here. collect.sh cannot
# import this file (a server may have no python3): its copy of the lists is generated from these
# by tools/generated.py between its "generated" marks, and tests/test_generated.py
# fails when that copy is not current. (Generating collect.sh at packaging time would leave the
# file in the source tree, the one users copy, without its lists.)
PROC_FILES = ("meminfo", "zoneinfo")  # /proc/; zoneinfo: the low watermarks (MemAvailable)
VM_SYSCTLS = (  # /proc/sys/vm/
    "min_free_kbytes",
    "nr_hugepages",
    "nr_overcommit_hugepages",
    "overcommit_memory",
    "overcommit_ratio",
    "overcommit_kbytes",
    "admin_reserve_kbytes",
    "user_reserve_kbytes",
)
NODE_LISTS = ("online", "possible", "has_memory")  # /sys/devices/system/node/
NODE_FILES = ("meminfo", "cpulist", "distance")  # /sys/devices/system/node/nodeN/
# Files left in a hugetlbfs mount hold their pages (HugePages_Free stays low with no process
# mapping them): each mount of /proc/self/mountinfo and the regular files directly in it, one
# "MOUNT<TAB>PAGESIZE<TAB>NAME<TAB>KB" line each (PAGESIZE: the mount's pagesize= option, or
# empty; KB: the pages it holds, du -k), names sorted bytewise, at most HUGETLBFS_MAX a mount.
HUGETLBFS = "umbp-sim-hugetlbfs.tsv"
HUGETLBFS_MAX = 256


class Usage(Exception):
    pass


PF_KTHREAD = 0x00200000  # /proc/PID/stat's flags: a kernel thread (include/linux/sched.h)


def process_stat(root, pid):
    """(comm, flags, starttime) of /proc/PID/stat, or None when it cannot be read (the process
    is gone, or a --root tree without the file)."""
    try:
        with open(os.path.join(root, "proc", str(pid), "stat"), "rb") as f:
            text = f.read(4096).decode("utf-8", "replace")
        comm = text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 2 :].split()
        return comm, int(fields[6]), int(fields[19])  # stat fields 9 and 22
    except (OSError, ValueError, IndexError):
        return None


class ProcessGone(Exception):
    """--pid's process exited (or another took its id) while it was collected."""


class Collector:
    def __init__(self, root, name):
        self.root = root
        self.name = name
        self.files = {}
        self.collected = []
        self.missing = {}
        self.notes = []

    def host(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    def read(self, path, rel=None):
        """Bytes of host ``path``; None (recorded as missing under ``rel``) when unreadable."""
        try:
            # Small reads: /proc/sys handlers allocate a buffer of the requested size, and a
            # 4 MiB read(2) on them fails with ENOMEM.
            with open(self.host(path), "rb", buffering=0) as f:
                chunks = []
                size = 0
                while size < MAX_READ:
                    chunk = f.read(65536)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    size += len(chunk)
                return b"".join(chunks)
        except OSError as e:
            self.missing[rel or path.lstrip("/")] = e.strerror or type(e).__name__
            return None

    def add(self, rel, data):
        self.files[rel] = data
        self.collected.append(rel)

    def copy(self, path, rel=None):
        rel = rel or path.lstrip("/")
        data = self.read(path, rel)
        if data is not None:
            self.add(rel, data)
        return data

    def listdir(self, path):
        try:
            return sorted(os.listdir(self.host(path)))
        except OSError as e:
            self.missing[path.lstrip("/")] = e.strerror or type(e).__name__
            return []

    def copy_tree(self, path):
        """Every readable regular file under ``path`` (write-only files such as demote skip)."""
        for entry in self.listdir(path):
            sub = path + "/" + entry
            full = self.host(sub)
            if os.path.islink(full):
                continue
            if os.path.isdir(full):
                self.copy_tree(sub)
            elif os.access(full, os.R_OK) and os.stat(full).st_mode & 0o444:
                self.copy(sub)


def mountinfo_cgroup(text):
    """(cgroup2 mount point, {v1 controller: mount point})."""
    v2 = None
    v1 = {}
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        parts, rparts = left.split(), right.split()
        if len(parts) < 5 or len(rparts) < 3:
            continue
        if rparts[0] == "cgroup2" and v2 is None:
            v2 = parts[4]
        elif rparts[0] == "cgroup":
            for opt in rparts[2].split(","):
                v1.setdefault(opt, parts[4])
    return v2, v1


def proc_cgroups(text):
    """(v2 path, {v1 controller: path}) from /proc/PID/cgroup."""
    v2 = None
    v1 = {}
    for line in text.splitlines():
        hid, _, rest = line.partition(":")
        ctrls, _, path = rest.partition(":")
        if hid == "0" and ctrls == "":
            v2 = path
        else:
            for c in ctrls.split(","):
                v1[c] = path
    return v2, v1


def ancestors(path):
    out = []
    p = path.rstrip("/") or "/"
    while True:
        out.append(p)
        if p == "/":
            return out
        p = os.path.dirname(p) or "/"


def read_limit(c, path):
    """int, None for no limit, "absent" when the file cannot be read or parsed."""
    try:
        with open(c.host(path)) as f:
            text = f.read().strip()
    except OSError:
        return "absent"
    if text == "max":
        return None
    if re.match(r"^[0-9]+$", text):
        v = int(text)
        return None if v >= V1_UNLIMITED else v
    return "absent"


def effective(c, mount, cg, fname):
    """(smallest limit along cg's ancestors, binding level); None when no level has the file."""
    best = None
    for level in ancestors(cg):
        v = read_limit(c, os.path.join(mount, level.lstrip("/"), fname))
        if v == "absent":
            continue
        if best is None or (v is not None and (best[0] is None or v < best[0])):
            best = (v, level)
    return best


def hugetlb_name(size):
    for unit, shift in (("GB", 30), ("MB", 20)):
        if size >= 1 << shift:
            return "%d%s" % (size >> shift, unit)
    return "%dKB" % (size >> 10)


def collect_cgroup(c, proc, sizes):
    raw = c.read(proc + "/cgroup")
    mi = c.read(proc + "/mountinfo")
    c.missing.pop((proc + "/cgroup").lstrip("/"), None)
    c.missing.pop((proc + "/mountinfo").lstrip("/"), None)
    cgroup_limits(c, raw, mi, sizes)


def cgroup_limits(c, cgroup, mountinfo, sizes):
    """The effective memory and hugetlb limits (under their v2 names) of the cgroup that
    ``cgroup`` (/proc/PID/cgroup's bytes, or None) names, found through ``mountinfo``."""
    v2_path, v1_paths = proc_cgroups((cgroup or b"").decode("utf-8", "replace"))
    v2_mount, v1_mounts = mountinfo_cgroup((mountinfo or b"").decode("utf-8", "replace"))
    wanted = [("memory.max", "memory", "memory.limit_in_bytes")]
    for s in sizes:
        n = hugetlb_name(s)
        for kind in ("", "rsvd."):  # the fault-time and the reservation-time (5.7+) limit
            wanted.append(
                (
                    "hugetlb.%s.%smax" % (n, kind),
                    "hugetlb",
                    "hugetlb.%s.%slimit_in_bytes" % (n, kind),
                )
            )
    for v2_name, ctrl, v1_name in wanted:
        rel = "sys/fs/cgroup/" + v2_name
        found = None
        how = ""
        if v2_path is not None and v2_mount is not None:
            found = effective(c, v2_mount, v2_path, v2_name)
            how = "cgroup v2 " + v2_path
        if found is None and ctrl in v1_paths and ctrl in v1_mounts:
            found = effective(c, v1_mounts[ctrl], v1_paths[ctrl], v1_name)
            how = "cgroup v1 %s:%s %s" % (ctrl, v1_paths[ctrl], v1_name)
        if found is None:
            c.missing[rel] = "no such limit file in the current cgroup or its parents"
            continue
        value, level = found
        c.add(rel, b"max\n" if value is None else ("%d\n" % value).encode())
        c.notes.append("%s: from %s (binding level %s)" % (rel, how, level))


def collect_server(c, pid):
    """What process ``pid`` saw, under proc/PID/: limits, cgroup, status Mems_allowed, numa_maps."""
    proc = "/proc/%d" % pid
    base = "proc/%d/" % pid
    c.copy(proc + "/limits", base + "limits")
    c.copy(proc + "/cgroup", base + "cgroup")
    status = c.read(proc + "/status", base + "status")
    if status is not None:
        lines = status.decode("utf-8", "replace").splitlines()
        for rel, keys in ((base + "status", STATUS_KEYS), ("proc/self/status", CREDENTIAL_KEYS)):
            keep = [line for line in lines if line.split(":", 1)[0] in keys]
            if rel == "proc/self/status" and not any(k.startswith("CapEff:") for k in keep):
                continue  # no credentials to record (not a Linux status file)
            c.add(rel, "".join(line + "\n" for line in keep).encode())
            if rel == "proc/self/status":
                c.notes.append("proc/self/status: the credentials of /proc/%d/status" % pid)
    maps = c.read(proc + "/numa_maps", base + "numa_maps")
    if maps is not None:
        out = []
        for line in maps.decode("utf-8", "replace").splitlines():
            tok = line.split()
            if len(tok) >= 2:
                out.append(" ".join(tok[:2] + [t for t in tok[2:] if NUMA_TOKEN.match(t)]))
        c.add(base + "numa_maps", "".join(line + "\n" for line in out).encode())


def collect_host(c, proc, pid=None):
    """Everything but the cgroup limits and the server's own files; the hugepage sizes."""
    for key in PROC_FILES:
        c.copy("/proc/" + key)
    for key in VM_SYSCTLS:
        c.copy("/proc/sys/vm/" + key)
    if c.copy("/proc/sys/kernel/osrelease") is None and c.root == "/":
        c.add("proc/sys/kernel/osrelease", (os.uname().release + "\n").encode())
        c.missing.pop("proc/sys/kernel/osrelease", None)
        c.notes.append("proc/sys/kernel/osrelease: from uname()")
    c.copy(proc + "/limits", "proc/self/limits")
    if pid is not None:
        c.notes.append("proc/self/limits: from /proc/%d/limits (the server process)" % pid)
    c.copy_tree("/sys/kernel/mm/hugepages")
    node = "/sys/devices/system/node"
    for key in NODE_LISTS:
        c.copy(node + "/" + key)
    for entry in c.listdir(node):
        if re.match(r"^node[0-9]+$", entry):
            for key in NODE_FILES:
                c.copy("%s/%s/%s" % (node, entry, key))
            c.copy_tree("%s/%s/hugepages" % (node, entry))
    collect_hugetlbfs(c)
    hp = c.host("/sys/kernel/mm/hugepages")
    sizes = []
    for d in os.listdir(hp) if os.path.isdir(hp) else []:
        m = re.match(r"^hugepages-([0-9]{1,15})kB$", d)
        if m:
            sizes.append(int(m.group(1)) * 1024)
    return sorted(sizes)


def hugetlbfs_mounts(text):
    """[(mount point, pagesize option or "")] of the hugetlbfs mounts in a mountinfo."""
    out = []
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        parts, rparts = left.split(), right.split()
        if len(parts) < 5 or len(rparts) < 3 or rparts[0] != "hugetlbfs":
            continue
        opts = [o[len("pagesize=") :] for o in rparts[2].split(",") if o.startswith("pagesize=")]
        if "\\" not in parts[4]:  # an escaped space, tab or newline: not listed
            out.append((parts[4], opts[0] if opts else ""))
    return out


def collect_hugetlbfs(c):
    """HUGETLBFS: the files in each hugetlbfs mount and the kB each holds (none: not written)."""
    try:
        with open(c.host("/proc/self/mountinfo"), "rb") as f:
            text = f.read(MAX_READ).decode("utf-8", "replace")
    except OSError:
        return
    lines = []
    for mnt, pagesize in hugetlbfs_mounts(text):
        try:
            names = sorted(os.listdir(c.host(mnt)), key=os.fsencode)  # as LC_ALL=C sort
        except OSError:
            continue
        kept = 0
        for name in names:
            if kept >= HUGETLBFS_MAX:
                break
            if "\t" in name or "\n" in name:
                continue
            try:
                st = os.lstat(os.path.join(c.host(mnt), name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                lines.append("%s\t%s\t%s\t%d\n" % (mnt, pagesize, name, (st.st_blocks + 1) // 2))
                kept += 1
    if lines:
        c.add(HUGETLBFS, "".join(lines).encode())


def host_arch(c):
    """[("machine", uname -m), ("page_size", getconf PAGESIZE)] of this host, the manifest keys
    the reader prefers to inferring them; none for a --root tree (not this host)."""
    if c.root != "/":
        return []
    out = [("machine", os.uname().machine)]
    try:
        out.append(("page_size", os.sysconf("SC_PAGESIZE")))
    except (ValueError, OSError):
        c.notes.append("page_size: sysconf(_SC_PAGESIZE) failed")
    return out


def collect(out, name, root="/", pid=None):
    check_output(out)  # before any collecting work
    c = Collector(root, name)
    proc = "/proc/self" if pid is None else "/proc/%d" % pid
    # its starttime: the process it was when collecting began (flags and comm change as it runs)
    seen = None if pid is None else (process_stat(root, pid) or (None, None, None))[2]
    collect_cgroup(c, proc, collect_host(c, proc, pid))
    left_out = [
        "environment variables (/proc/*/environ): never read",
        "command lines (/proc/*/cmdline): never read",
    ]
    if pid is not None:
        collect_server(c, pid)
        if (process_stat(root, pid) or (None, None, None))[2] != seen:  # partly another's, none
            raise ProcessGone(
                "--pid %d: the process exited while it was collected; nothing written" % pid
            )
        c.notes.append("cgroup limits: of /proc/%d/cgroup (the server process)" % pid)
        left_out += [
            "proc/%d/status: all but %s" % (pid, ", ".join(STATUS_KEYS + CREDENTIAL_KEYS)),
            "proc/%d/numa_maps: file names" % pid,
        ]
    add_manifest(c, TOOL, [("pid", pid)] + host_arch(c), left_out)
    write_tar(out, name, c.files)
    return c


def add_manifest(c, tool, head=(), left_out=None):
    """NAME/umbp-sim-collect.json: tool, name, time, ``head`` (key, value) pairs, what was
    collected (with sizes) and missing, ``left_out`` (when not None) and the notes."""
    manifest = {
        "tool": tool,
        "name": c.name,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    manifest.update(head)
    manifest["collected"] = sorted(c.collected)
    manifest["files"] = {rel: len(c.files[rel]) for rel in sorted(c.files)}  # see dump/manifest.py
    manifest["missing"] = dict(sorted(c.missing.items()))
    if left_out is not None:
        manifest["left_out"] = left_out
    manifest["notes"] = c.notes
    c.files[MANIFEST] = (json.dumps(manifest, indent=1) + "\n").encode()


def write_tar(out, name, files):
    write_output(out, tar_bytes(out, name, files))


REFUSED = "not a regular file: refused (-o - writes to stdout)"
KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)


def cannot_write(out, e, flag="-o"):
    return OSError("%s %s: cannot write: %s" % (flag, out, e.strerror or type(e).__name__))


def check_output(out, flag="-o", dash=None):
    """Raise OSError (its one line) unless ``out`` may be written: ``-`` (stdout, not a
    terminal), a path that does not exist in a writable directory, or an existing regular file
    (replaced). A symbolic link, a directory, a device, a FIFO or a socket is never replaced
    (nor written through): run before any collecting work and again just before the write.
    Returns the lstat of the existing regular file, or None. ``flag`` is the option that named
    ``out``, in the message (umbp-sim's other output files are checked here too); only ``-o``
    takes ``-`` for stdout (``dash=False``: a ``-o`` that does not)."""
    if dash is None:
        dash = flag == "-o"
    if out == "-" and dash:
        if sys.stdout.isatty():
            raise OSError("-o -: stdout is a terminal; redirect it to a file (-o - > host.tar.gz)")
        return None
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise cannot_write(out, e, flag) from None
    if st is not None:
        if stat.S_ISREG(st.st_mode):
            return st
        what = next((w for test, w in KINDS if test(st.st_mode)), "not a file")
        refused = REFUSED if dash else REFUSED.split(" (")[0]
        raise OSError("%s %s: %s, %s" % (flag, out, what, refused))
    directory = os.path.dirname(out) or "."
    try:
        if not stat.S_ISDIR(os.stat(directory).st_mode):
            raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
    except OSError as e:
        raise cannot_write(out, e, flag) from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise cannot_write(out, OSError(errno.EACCES, os.strerror(errno.EACCES)), flag)
    return None


def write_output(out, data):
    """``data`` to stdout (``-``) or, through write_new, to the file ``out``."""
    if out != "-":
        write_new(out, data)
        return
    check_output(out)
    try:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    except OSError as e:
        raise cannot_write(out, e) from None


def write_new(out, data, flag="-o", keep_mode=False, dash=None):
    """Write the regular file ``out`` through a fresh temporary file beside it, then move it
    into place (``move_into_place``); what is at ``out`` is replaced only when it is a regular
    file (check_output).

    The temporary file is created with O_EXCL (``tempfile.mkstemp``: a random name, 0600), so
    a file or symbolic link planted under a predictable name is never written through (this
    runs as root, often into /tmp). The final mode is 0644 minus the umask, as ``open()`` would
    make it (``keep_mode``: an existing file's own mode). OSError "-o OUT: ..." (one line,
    ``flag`` for -o) when it cannot.
    """
    old = check_output(out, flag, dash)
    directory = os.path.dirname(out) or "."
    try:
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(out) + ".", dir=directory)
    except OSError as e:
        raise cannot_write(out, e, flag) from None
    try:
        with os.fdopen(fd, "wb") as f:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o644 & ~umask
            if keep_mode and old is not None:
                mode = stat.S_IMODE(old.st_mode)
            os.fchmod(f.fileno(), mode)
            f.write(data)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise cannot_write(out, e, flag) from None
    move_into_place(tmp, out, flag, dash)


def move_into_place(tmp, out, flag="-o", dash=None):
    """The file ``tmp`` (in ``out``'s directory) becomes ``out``: a new ``out`` is made with
    link(2), which never replaces anything that appeared there meanwhile; an existing regular
    file is replaced by rename(2) after checking again that it still is one. ``tmp`` is gone
    afterwards, whatever happens; OSError "-o OUT: ..." (one line) when it cannot."""
    try:
        if check_output(out, flag, dash) is None:
            try:
                os.link(tmp, out)  # EEXIST when anything appeared at out meanwhile
            except FileExistsError:
                check_output(out, flag, dash)  # names what it is; a regular file: replaced
                os.replace(tmp, out)
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK):
                    raise
                os.replace(tmp, out)  # a file system without hard links
            else:
                os.unlink(tmp)
        else:
            os.replace(tmp, out)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if e.strerror is None:  # check_output's own line
            raise
        raise cannot_write(out, e, flag) from None


def tar_bytes(out, name, files):
    """The tarball of ``files`` (rel -> bytes) under ``name/``, the manifest first, compressed
    as ``out``'s suffix says (.gz/.tgz, .bz2/.tbz2, .xz/.txz; else none)."""
    mode = "w"
    if out == "-" or out.endswith((".gz", ".tgz")):  # stdout: gzip, as the default name
        mode = "w:gz"
    elif out.endswith((".bz2", ".tbz2")):
        mode = "w:bz2"
    elif out.endswith((".xz", ".txz")):
        mode = "w:xz"
    buf = io.BytesIO()
    now = int(time.time())
    with tarfile.open(fileobj=buf, mode=mode) as tar:
        dirs = set()
        for rel in sorted(files, key=lambda r: (r != MANIFEST, r)):  # the manifest first
            parts = (name + "/" + rel).split("/")
            for i in range(1, len(parts)):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, now
                    tar.addfile(info)
            info = tarfile.TarInfo(name + "/" + rel)
            info.size, info.mode, info.mtime = len(files[rel]), 0o444, now
            tar.addfile(info, io.BytesIO(files[rel]))
    return buf.getvalue()


def parse_args(argv):
    opts = {"output": None, "name": None, "pid": None, "root": "/"}
    flags = {"-o": "output", "--output": "output", "--name": "name", "--pid": "pid"}
    flags["--root"] = "root"  # tests: a directory laid out like a host
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            print(USAGE)
            sys.exit(0)
        key, eq, value = arg.partition("=")
        if key not in flags or (not eq and i + 1 >= len(argv)):
            raise Usage("%s: %s" % (arg, "expects a value" if key in flags else "unknown option"))
        if not eq:
            value = argv[i + 1]
            i += 1
        opts[flags[key]] = value
        i += 1
    name = opts["name"] or os.uname().nodename or "host"
    if "/" in name or name in (".", ".."):
        raise Usage("--name: %r is not a usable directory name" % name)
    opts["name"] = name
    if opts["pid"] is not None:
        if not re.match(r"^[1-9][0-9]{0,9}$", opts["pid"]):
            raise Usage("--pid: %r is not a process id" % opts["pid"])
        pid = int(opts["pid"])
        if not os.path.isdir(os.path.join(opts["root"], "proc", str(pid))):
            raise Usage("--pid %d: no such process" % pid)
        seen = process_stat(opts["root"], pid)
        if seen is not None and seen[1] & PF_KTHREAD:
            raise Usage(
                "--pid %d: a kernel thread (%s), not a process that allocates; give the "
                "server's process id" % (pid, seen[0].encode("unicode_escape").decode())
            )
        opts["pid"] = pid
    opts["output"] = opts["output"] or name + ".tar.gz"
    return opts


def main(argv):
    try:
        opts = parse_args(argv)
    except Usage as e:
        sys.stderr.write("%s: %s\n%s\n" % (PROG, e, USAGE))
        return EX_USAGE
    try:
        c = collect(opts["output"], opts["name"], opts["root"], opts["pid"])
    except OSError as e:
        sys.stderr.write("%s: %s\n" % (PROG, e))
        return EX_CANTCREAT
    except ProcessGone as e:
        sys.stderr.write("%s: %s\n" % (PROG, e))
        return EX_USAGE
    sys.stderr.write(
        "%s: %s/, %d files, %d missing (listed in %s/%s)\n"
        % (
            wrote(opts["output"]),
            opts["name"],
            len(c.collected),
            len(c.missing),
            opts["name"],
            MANIFEST,
        )
    )
    return 0


def wrote(out):
    return "wrote the tarball to stdout" if out == "-" else "wrote " + out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
