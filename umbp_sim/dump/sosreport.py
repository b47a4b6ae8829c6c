"""sosreport archives and directories: ``sos_commands/`` fills what ``proc/`` and ``sys/`` lack.

A sosreport (``sosreport-HOST-...tar.xz``) is read as it is: its top directory is the dump's
``NAME/``, and ``proc/meminfo``, ``sys/devices/system/node/...``, ``sys/kernel/mm/hugepages/...``
and ``proc/sys/vm/...`` are where the other dumps have them. What sos records only as command
output is served under the path the parsers read, each time with a note:

- ``proc/sys/vm/<key>`` and ``proc/sys/kernel/osrelease``: the ``vm.<key> = N`` and
  ``kernel.osrelease = R`` lines of ``sos_commands/kernel/sysctl_-a``;
- ``proc/sys/kernel/osrelease``, failing that: the release field of
  ``sos_commands/kernel/uname_-a`` (``Linux HOST RELEASE #1 SMP ...``);
- the dump's name: ``sos_commands/host/hostname`` (else the top directory's name).

An error about a value taken from them names the sos file and its line. ``with_sos_commands``
returns the source unchanged when it has no ``sos_commands/``.
"""

from __future__ import annotations

import re

from umbp_sim.collect_scripts.standalone_collect import VM_SYSCTLS
from umbp_sim.dump.notes import Note
from umbp_sim.dump.source import DumpSource

SYSCTL = "sos_commands/kernel/sysctl_-a"
UNAME = "sos_commands/kernel/uname_-a"
HOSTNAME = "sos_commands/host/hostname"
_SYSCTL_LINE = re.compile(r"^(vm\.[a-z_]+|kernel\.osrelease)\s*=\s*(\S+)\s*$", re.ASCII)
_NUMBER = re.compile(r"^[0-9]{1,20}$", re.ASCII)
_RELEASE = re.compile(r"^[0-9]+\.[0-9]+[A-Za-z0-9._+~-]{0,120}$", re.ASCII)
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$", re.ASCII)


class SosSource(DumpSource):
    """A dump source with files taken from sos command output (``served``: rel -> (text,
    where it came from, the note))."""

    def __init__(self, inner: DumpSource, served: dict[str, tuple[str, str, str]], name: str):
        self.inner = inner
        self.served = served
        self.label = inner.label
        self.name = name
        self.bare_meminfo = inner.bare_meminfo
        self.rejected = inner.rejected
        self.notes: list[Note] = []  # the notes of the served files that were read

    def where(self, rel: str) -> str:
        return self.served[rel][1] if rel in self.served else self.inner.where(rel)

    def read_bytes(self, rel: str) -> bytes | None:
        data = self.inner.read_bytes(rel)
        if data is None and rel in self.served:
            text, _, note = self.served[rel]
            if note not in self.notes:
                self.notes.append(Note("sos-commands", note))
            return text.encode()
        return data

    def listdir(self, rel: str) -> list[str]:
        return self.inner.listdir(rel)

    def close(self) -> None:
        self.inner.close()


def _sysctl_values(src: DumpSource) -> dict[str, tuple[str, int]]:
    """{``vm.key`` or ``kernel.osrelease``: (value, line)} from sysctl_-a (first line wins)."""
    text = _text(src, SYSCTL)
    out: dict[str, tuple[str, int]] = {}
    for n, line in enumerate((text or "").splitlines(), 1):
        m = _SYSCTL_LINE.match(line)
        if m and m.group(1) not in out:
            out[m.group(1)] = (m.group(2), n)
    return out


def _text(src: DumpSource, rel: str) -> str | None:
    data = src.read_bytes(rel)
    return None if data is None else data.decode("utf-8", "replace")


def with_sos_commands(src: DumpSource) -> DumpSource:
    """``src``, or a ``SosSource`` over it when it is a sosreport (has ``sos_commands/``)."""
    if src.bare_meminfo or not src.listdir("sos_commands"):
        return src
    served: dict[str, tuple[str, str, str]] = {}
    sysctl = _sysctl_values(src)
    for key in VM_SYSCTLS:  # the sysctls a dump carries (collect_scripts/standalone_collect.py)
        value = sysctl.get(f"vm.{key}")
        if value and _NUMBER.match(value[0]):
            served[f"proc/sys/vm/{key}"] = (
                value[0] + "\n",
                f"{src.where(SYSCTL)}:{value[1]}",
                f"proc/sys/vm: from {SYSCTL} (vm.* lines)",
            )
    release = sysctl.get("kernel.osrelease")
    if release and _RELEASE.match(release[0]):
        served["proc/sys/kernel/osrelease"] = (
            release[0] + "\n",
            f"{src.where(SYSCTL)}:{release[1]}",
            f"kernel release from {SYSCTL} (kernel.osrelease)",
        )
    else:
        fields = (_text(src, UNAME) or "").split()
        if len(fields) >= 3 and _RELEASE.match(fields[2]):
            served["proc/sys/kernel/osrelease"] = (
                fields[2] + "\n",
                f"{src.where(UNAME)}:1",
                f"kernel release from {UNAME}",
            )
    host = (_text(src, HOSTNAME) or "").strip()
    return SosSource(src, served, host if _HOST.match(host) else src.name)
