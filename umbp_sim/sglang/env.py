"""The four ``SGLANG_HICACHE_HOST_*`` variables, parsed exactly as sglang's UMBP allocator does.

sglang (``mem_cache/storage/umbp/umbp_host_allocator.py``):

- booleans: unset -> default; else ``raw.strip().lower() in ("1", "true", "yes", "on")``, so
  any other value, including the empty string, means off;
- integers: unset or ``""`` -> default; else ``int(raw)`` (base 10; a value such as ``2M``
  raises a bare ValueError in the allocator's constructor).

sglang's caller (``get_allocator_from_storage``) only falls back to the torch allocator on
ImportError/RuntimeError, so that ValueError kills the server. umbp-sim's own parse reports the
same condition as an :class:`EnvVarError` naming the variable; :func:`sglang_env_failure`
says what sglang itself would do, for the replay tool.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from umbp_sim.errors import UmbpSimError
from umbp_sim.vocabulary.bounded import shown
from umbp_sim.vocabulary.exit_codes import EX_USAGE
from umbp_sim.vocabulary.units import SizeError, parse_size

HUGEPAGE = "SGLANG_HICACHE_HOST_HUGEPAGE"
HUGEPAGE_SIZE = "SGLANG_HICACHE_HOST_HUGEPAGE_SIZE"
NUMA_NODE = "SGLANG_HICACHE_HOST_NUMA_NODE"
PREFAULT = "SGLANG_HICACHE_HOST_PREFAULT"
VARIABLES = (HUGEPAGE, HUGEPAGE_SIZE, NUMA_NODE, PREFAULT)
# Any non-empty value: sglang allocates shared (memfd) buffers for the standalone UMBP process.
STANDALONE = "UMBP_STANDALONE_ADDRESS"

TRUTHY = ("1", "true", "yes", "on")
# Values sglang reads as off that a person writing them also meant as off (no warning).
FALSY = ("0", "false", "no", "off")

DEFAULT_HUGEPAGE = True
DEFAULT_HUGEPAGE_SIZE = 2 * 1024 * 1024
DEFAULT_NUMA_NODE = -1
DEFAULT_PREFAULT = True

# What sglang's caller does with an exception from the allocator's constructor.
SGLANG_FALLBACK_EXCEPTIONS = ("ImportError", "RuntimeError")


class EnvVarError(UmbpSimError, ValueError):
    """A ``SGLANG_HICACHE_HOST_*`` value sglang cannot parse; names the variable and value.

    A ValueError like sglang's own, so code that treats it as sglang does sees the same type.
    """

    exit_code = EX_USAGE

    def __init__(self, variable: str, value: str, message: str) -> None:
        self.variable = variable
        self.value = value
        super().__init__(message)


@dataclass(frozen=True)
class HostAllocEnv:
    """The allocator settings sglang derives from the environment.

    ``warnings`` lists values sglang accepts silently but that probably do not mean what the
    person wrote (``SGLANG_HICACHE_HOST_HUGEPAGE=enabled`` is off).
    """

    use_hugepage: bool = DEFAULT_HUGEPAGE
    hugepage_size: int = DEFAULT_HUGEPAGE_SIZE
    numa_node: int = DEFAULT_NUMA_NODE
    prefault: bool = DEFAULT_PREFAULT
    warnings: tuple[str, ...] = ()


def _sglang_bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None:
        return default
    return raw.strip().lower() in TRUTHY


def _sglang_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    return int(raw) if raw is not None and raw != "" else default


def sglang_parse_env(env: Mapping[str, str] | None = None) -> HostAllocEnv:
    """Exactly sglang's parse, in sglang's order: a bad integer raises sglang's bare ValueError."""
    env = os.environ if env is None else env
    return HostAllocEnv(
        use_hugepage=_sglang_bool(env, HUGEPAGE, DEFAULT_HUGEPAGE),
        hugepage_size=_sglang_int(env, HUGEPAGE_SIZE, DEFAULT_HUGEPAGE_SIZE),
        numa_node=_sglang_int(env, NUMA_NODE, DEFAULT_NUMA_NODE),
        prefault=_sglang_bool(env, PREFAULT, DEFAULT_PREFAULT),
    )


def _int_error(name: str, raw: str) -> EnvVarError:
    if name == HUGEPAGE_SIZE:
        hint = "a number of bytes such as 2097152 (2 MiB) or 1073741824 (1 GiB)"
        try:
            as_bytes = parse_size(raw, name)
        except SizeError:
            pass
        else:
            hint = f"bytes, e.g. {name}={as_bytes}"
    else:
        hint = "a node number such as 0, or -1 for no binding"
    return EnvVarError(
        name,
        raw,
        f"{name}={shown(raw)} is not an integer: sglang parses it with int() and the server dies "
        f"with ValueError at startup; use {hint}",
    )


def _bool_warning(name: str, raw: str) -> str | None:
    v = raw.strip().lower()
    if v in TRUTHY or v in FALSY:
        return None
    return (
        f"{name}={shown(raw)} is not one of {'/'.join(TRUTHY)} (or {'/'.join(FALSY)}): "
        f"sglang reads it as off"
    )


def parse_env(env: Mapping[str, str] | None = None) -> HostAllocEnv:
    """sglang's values, but an unparsable integer is an EnvVarError naming the variable."""
    env = os.environ if env is None else env
    for name in (HUGEPAGE_SIZE, NUMA_NODE):
        raw = env.get(name)
        if raw is None or raw == "":
            continue
        try:
            int(raw)
        except ValueError:
            raise _int_error(name, raw) from None
    warnings = tuple(
        w
        for w in (_bool_warning(name, env[name]) for name in (HUGEPAGE, PREFAULT) if name in env)
        if w is not None
    )
    parsed = sglang_parse_env(env)
    return HostAllocEnv(
        use_hugepage=parsed.use_hugepage,
        hugepage_size=parsed.hugepage_size,
        numa_node=parsed.numa_node,
        prefault=parsed.prefault,
        warnings=warnings,
    )


@dataclass(frozen=True)
class SglangEnvFailure:
    """What sglang does with an environment it cannot parse.

    ``error`` is the exception as sglang's log shows it (``ValueError: invalid literal for
    int() with base 10: '2M'``); ``falls_back`` is False because sglang's caller only catches
    ImportError/RuntimeError, so the server dies instead of using the torch allocator.
    """

    variable: str
    value: str
    exception_type: str
    error: str
    falls_back: bool
    consequence: str


def sglang_env_failure(env: Mapping[str, str] | None = None) -> SglangEnvFailure | None:
    """None when sglang's allocator constructor accepts ``env``; else what happens instead."""
    env = os.environ if env is None else env
    # sglang reads HUGEPAGE_SIZE before NUMA_NODE: the first bad one is the one it reports.
    for name in (HUGEPAGE_SIZE, NUMA_NODE):
        raw = env.get(name)
        if raw is None or raw == "":
            continue
        try:
            int(raw)
        except ValueError as e:
            exc_type = type(e).__name__
            falls_back = exc_type in SGLANG_FALLBACK_EXCEPTIONS
            return SglangEnvFailure(
                variable=name,
                value=raw,
                exception_type=exc_type,
                error=f"{exc_type}: {e}",
                falls_back=falls_back,
                consequence=(
                    "UMBPHostTensorAllocator() raises ValueError; get_allocator_from_storage "
                    "only falls back on ImportError/RuntimeError, so the server dies at startup"
                ),
            )
    return None
