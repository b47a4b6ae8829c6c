"""The host counters a scenario's ``[expect].counters`` names, read from a simulated host."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

from umbp_sim.engine.spec import RunError
from umbp_sim.errors import UmbpSimError
from umbp_sim.sim import HugePages, SimHost
from umbp_sim.vocabulary.units import parse_size

# A pool counter's key: its field is one of HugePages' (SimKernel's declared counters).
_FIELDS = "|".join(f.name for f in dataclasses.fields(HugePages))
_COUNTER_RE = re.compile(
    rf"^(?:node(?P<node>\d+)\.)?hugepages\.(?P<size>[0-9A-Za-z]+)\.(?P<field>{_FIELDS})$"
)


def read_counters(host: SimHost, keys: Iterable[str]) -> dict[str, int]:
    """``{key: value}`` of each counter named, read from ``host`` now; RunError for a key that
    names no counter of this host."""
    out: dict[str, int] = {}
    for key in keys:
        try:
            out[key] = _counter(host, key)
        except KeyError:
            raise RunError(
                f"[expect].counters.{key}: no such counter (use "
                "hugepages.<size>.<total|free|reserved|surplus>, "
                "node<N>.hugepages.<size>.<total|free|surplus> or meminfo.<Field>)"
            ) from None
        except (UmbpSimError, ValueError) as e:  # a size or node this host does not have
            raise RunError(f"[expect].counters.{key}: {e}") from None
    return out


def _counter(host: SimHost, key: str) -> int:
    if key.startswith("meminfo."):
        name = key.removeprefix("meminfo.")
        info = host.meminfo()
        if name not in info:
            raise KeyError(key)
        return info[name]
    m = _COUNTER_RE.match(key)
    if not m:
        raise KeyError(key)
    if m.group("node") is not None and m.group("field") == "reserved":
        raise KeyError(key)  # the kernel keeps no per-node Rsvd (docs/kernel-model.md 0)
    size = parse_size(m.group("size"), key)
    pages = (
        host.node_hugepages(int(m.group("node")), size)
        if m.group("node") is not None
        else host.hugepages(size)
    )
    return int(getattr(pages, m.group("field")))
