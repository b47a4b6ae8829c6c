"""The request to replay, from the command line: a raw ``alloc`` or sglang's HiCache host pool.

Raw: ``--size 100000595968 --backing hugetlb --hugepage-size 2MiB --numa-node 3 --no-prefault``.
sglang: ``--model-layers 32 --kv-heads 8 --head-dim 128 --dtype bfloat16 --hicache-size 100
--page-size 64 --layout layer_first`` (or MLA: ``--kv-lora-rank 512 --qk-rope-head-dim 64``),
with the allocator settings from ``--env SGLANG_HICACHE_HOST_*=V``. Mixing the two kinds, a
size such as ``12XB`` or an unknown backing is a ``RequestError`` (exit 64) naming the flag.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass, field
from typing import Any

from umbp_sim.allocator_profiles import FIELD_PROFILE, MORI_LOG_ENV
from umbp_sim.diagnose.dram_tier import (
    VARIABLES as DRAM_VARIABLES,
    DramTierError,
    dram_tier_request,
)
from umbp_sim.diagnose.error_line import (
    ErrorLine,
    ErrorLineError,
    parse_error_line,
    read_error_text,
)
from umbp_sim.diagnose.request_flags import (
    _FLAG_OF,
    BACKINGS as BACKINGS,  # re-exported
    MAX_RANKS,
    _flag,
    add_request_arguments as add_request_arguments,
)
from umbp_sim.diagnose.symptom import Symptom, SymptomError, parse_symptom
from umbp_sim.engine.spec import Alloc, HostChange, Run, SglangStartup
from umbp_sim.errors import UmbpSimError
from umbp_sim.machine import Machine
from umbp_sim.request import AllocRequest
from umbp_sim.sglang import env as sgenv
from umbp_sim.sglang.release import default_sglang_release
from umbp_sim.sglang.sizing import HicacheRequest, SizingError, hicache_request_of_table
from umbp_sim.vocabulary.backing import DEMOTED_TO, HUGETLB_BACKINGS
from umbp_sim.vocabulary.bounded import shown
from umbp_sim.vocabulary.exit_codes import EX_USAGE
from umbp_sim.vocabulary.units import format_size, unit_bytes
from umbp_sim.vocabulary.value_types import MAX_BYTES, MAX_INT

MiB = 1 << 20

RAW_FLAGS = ("size", "backing", "hugepage_size", "numa_node", "no_prefault")
SGLANG_FLAGS = (
    "model_layers", "kv_heads", "head_dim", "dtype", "hicache_size", "hicache_ratio",
    "device_pool_tokens", "page_size", "layout", "tp_size", "kv_lora_rank",
    "qk_rope_head_dim", "index_head_dim",
)  # fmt: skip


ENV_VARIABLES = (*sgenv.VARIABLES, sgenv.STANDALONE, *MORI_LOG_ENV, *DRAM_VARIABLES)


class RequestError(UmbpSimError):
    """A request that cannot be read from the flags; the message names the flag."""

    exit_code = EX_USAGE


@dataclass(frozen=True)
class Request:
    """One request to replay: a raw allocator call (``alloc``, the ``AllocRequest`` of
    umbp_sim/request.py) or sglang's HiCache host pool (``sglang``, the scenario-style table whose
    allocator settings come from ``env``)."""

    alloc: AllocRequest | None = None  # a raw request's call; None: an sglang request
    sglang: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    allocator: str = FIELD_PROFILE  # the allocator profile the server runs
    sglang_release: str = "0.5.23"  # whose UMBPHostTensorAllocator: a release, or "installed"
    error_line: ErrorLine | None = None  # the RuntimeError line the replay was asked about
    # What the server showed (a signal, an OOM kill, the demotion), the replay's question.
    symptom: Symptom | None = None
    # sglang's ranks on this host (tp/dp on one node), each its own process and pool of this
    # request, started in turn on one host: its pools, MemAvailable and commit accounting.
    ranks: int = 1

    def __post_init__(self) -> None:
        # The line names one alloc call (its size, backing, node): it is a raw request. An
        # sglang startup makes several, and the search around the line (diagnose/hypotheses.py)
        # would move the edges of the first failing one, not of the one the line names.
        if self.error_line is not None and self.alloc is None:
            raise ValueError("an error line replays as the raw alloc it names, not an sglang one")
        if self.error_line is not None and self.symptom is not None:
            raise ValueError("one question: an error line or a symptom, not both")

    @property
    def kind(self) -> str:
        """ "raw" or "sglang"."""
        return "sglang" if self.alloc is None else "raw"

    @property
    def sglang_raised(self) -> bool:
        """The request is the alloc an sglang error line names: sglang 0.5.23 made that call
        after its host check passed, runs the check again when restarted with a fix, and is
        configured with its own knobs (``--hicache-size``, ``SGLANG_HICACHE_HOST_*``)."""
        return self.error_line is not None

    @property
    def speaks_sglang(self) -> bool:
        """Changes are written in sglang's terms: an sglang request or an sglang error line."""
        return self.kind == "sglang" or self.sglang_raised

    @property
    def raw(self) -> AllocRequest:
        """A raw request's allocator call (an sglang request has none: AssertionError)."""
        assert self.alloc is not None, "an sglang request has no single allocator call"
        return self.alloc

    # ---- what the allocator is asked -----------------------------------------------------
    def hicache(self) -> HicacheRequest:
        return hicache_request_of_table(self.sglang)

    def settings(self) -> tuple[str, int, int, bool]:
        """(backing, hugepage_size, numa_node, prefault) the allocator is called with.

        For sglang: its parse of the env; a malformed integer leaves that setting's default.
        """
        if self.alloc is not None:
            return self.alloc.fields()[1:]
        env = dict(self.env)
        for name in (sgenv.HUGEPAGE_SIZE, sgenv.NUMA_NODE):
            try:
                int(env.get(name) or "0")
            except ValueError:
                env.pop(name)
        s = sgenv.sglang_parse_env(env)
        if env.get(sgenv.STANDALONE):  # sglang's shared (fd-shareable) buffers
            backing = "AnonymousShmHugetlb" if s.use_hugepage else "AnonymousShm"
        else:
            backing = "AnonymousHugetlb" if s.use_hugepage else "Anonymous"
        return backing, s.hugepage_size, s.numa_node, s.prefault

    def alloc_request(self, size: int | None = None) -> AllocRequest:
        """The allocator call for one buffer (``size``; a raw request's own size by default)."""
        if self.alloc is not None:
            return self.alloc if size is None else dataclasses.replace(self.alloc, size=size)
        assert size is not None, "an sglang request's buffers each have their own size"
        return AllocRequest(size, *self.settings())

    def buffer_sizes(self) -> list[int]:
        """Bytes of each ``alloc`` the request makes (three for MLA kv_split with an indexer)."""
        if self.alloc is not None:
            return [self.alloc.size]
        return [b.nbytes for b in self.hicache().buffers]

    def wants_hugepages(self) -> bool:
        return self.settings()[0] in HUGETLB_BACKINGS

    # ---- variants, for the fixes ---------------------------------------------------------
    def with_alloc(self, **changes: Any) -> Request:
        """A raw request with its allocator call changed (an sglang request as it is)."""
        if self.alloc is None:
            return self
        return dataclasses.replace(self, alloc=dataclasses.replace(self.alloc, **changes))

    def with_node(self, node: int) -> Request:
        if self.alloc is not None:
            return self.with_alloc(numa_node=node)
        return self.with_env(**{sgenv.NUMA_NODE: str(node)})

    def with_hugepage_size(self, size: int) -> Request:
        if self.alloc is not None:
            return self.with_alloc(hugepage_size=size)
        return self.with_env(**{sgenv.HUGEPAGE_SIZE: str(size)})

    def without_hugepages(self) -> Request:
        if self.alloc is not None:
            return self.with_alloc(backing=DEMOTED_TO.get(self.alloc.backing, self.alloc.backing))
        return self.with_env(**{sgenv.HUGEPAGE: "0"})

    def with_allocator(self, profile: str) -> Request:
        return dataclasses.replace(self, allocator=profile)

    def with_env(self, **values: str) -> Request:
        return dataclasses.replace(self, env={**self.env, **values})

    def with_hicache_size(self, gb: int) -> Request:
        return dataclasses.replace(self, sglang={**self.sglang, "hicache_size": gb})

    # ---- how a person writes a change -----------------------------------------------------
    def node_change(self, node: int) -> str:
        if not self.speaks_sglang:
            return f"--numa-node {node}"
        return f"{sgenv.NUMA_NODE}={node}"

    def hugepage_size_change(self, size: int) -> str:
        if not self.speaks_sglang:
            return f"--hugepage-size {format_size(size)}"
        return f"{sgenv.HUGEPAGE_SIZE}={size}"

    def no_hugepages_change(self) -> str:
        if not self.speaks_sglang:
            return f"--backing {_FLAG_OF[self.without_hugepages().raw.backing]}"
        return f"{sgenv.HUGEPAGE}=0"

    def describe(self) -> str:
        backing, hp, node, prefault = self.settings()
        alloc = (
            f"backing {backing}, hugepage_size {format_size(hp)}, numa_node {node}, "
            f"prefault {'on' if prefault else 'off'}"
        )
        each = f"{self.ranks} ranks on this host, each" if self.ranks > 1 else ""
        if self.alloc is not None:
            size = self.alloc.size
            unit = getattr(size, "unit", "")
            spelled = f" = {format_size(size)}" if unit and unit != "B" else ""
            call = f"alloc({size} bytes{spelled}, {alloc})" + self._dram_tier_text()
            return f"{each} {call}" if each else call
        h = self.hicache()
        sizes = " + ".join(str(b.nbytes) for b in h.buffers)
        whose = f"{each} with its own" if each else "one rank:"
        return (
            f"sglang HiCache host pool of {whose} {h.bytes_per_token} B/token, {h.tokens} "
            f"tokens, {h.nbytes} bytes checked, alloc {sizes} bytes ({alloc})"
        ) + self._dram_tier_text()

    def _dram_tier_text(self) -> str:
        tier = dram_tier_request(self.env)
        if tier is None:
            return ""
        b, hp, node, prefault = tier.fields()[1:]
        return (
            f", then mori's DRAM tier alloc({tier.size} bytes, backing {b}, hugepage_size "
            f"{format_size(hp)}, numa_node {node}, prefault {'on' if prefault else 'off'})"
        )

    def engine_run(
        self,
        machine: Machine,
        allocator: str | None = None,
        changes: tuple[HostChange, ...] = (),
        host_check: bool = False,
    ) -> Run:
        """The engine's ``Run`` of this request on ``machine`` (``allocator``: the request's by
        default), the admin writes ``changes`` first. A raw request's env holds MORI_* only
        (its allocator process reads them); sglang's is its startup's too. ``host_check``: an
        error line's alloc behind sglang's host check (a fix's run: sglang restarted on the
        host the fix leaves); the replay of the line itself runs without it, since the line
        says the check passed when the server started."""
        work: Alloc | SglangStartup
        if self.alloc is not None:
            work = Alloc(
                self.alloc,
                host_check=host_check and self.sglang_raised,
                ranks=self.ranks,
                dram_tier=dram_tier_request(self.env),
            )
        else:
            work = SglangStartup(
                dict(self.sglang),
                self.sglang_release,
                ranks=self.ranks,
                dram_tier=dram_tier_request(self.env),
            )
        return Run(
            machine,
            work,
            allocator=allocator or self.allocator,
            env=tuple(self.env.items()),
            changes=changes,
            label=machine.name,
        )


def request_from_args(args: argparse.Namespace) -> Request:
    """The request the flags describe; RequestError naming the flag for a bad combination."""
    request = _request_from_flags(args)
    sglang = getattr(args, "sglang", None) or default_sglang_release()
    # The tp ranks of an sglang request share this host unless --ranks says how many do.
    ranks = getattr(args, "ranks", None) or request.sglang.get("tp_size") or 1
    if ranks > MAX_RANKS:
        raise RequestError(
            f"--tp-size {ranks}: more ranks than one host runs (at most {MAX_RANKS}); give "
            "--ranks N for the ranks on this host"
        )
    return dataclasses.replace(
        request,
        allocator=getattr(args, "allocator", None) or FIELD_PROFILE,
        sglang_release=sglang,
        ranks=ranks,
    )


MAX_PASTE = 16 << 20  # characters of `--error -`: a traceback with its log, not a whole log


def _error_line(args: argparse.Namespace) -> ErrorLine | None:
    raw = getattr(args, "error", None)
    if raw is None:
        return None
    try:
        stdin = getattr(sys.stdin, "buffer", sys.stdin)  # bytes; a replaced text stdin too
        text = read_error_text(stdin) if raw == "-" else raw
        return parse_error_line(text, "--error" if raw != "-" else "--error - (stdin)")
    except ErrorLineError as e:
        raise RequestError(str(e)) from None


def _symptom(args: argparse.Namespace) -> Symptom | None:
    raw = getattr(args, "symptom", None)
    if raw is None:
        return None
    if getattr(args, "error", None) is not None:
        raise RequestError(
            "--symptom cannot be combined with --error: the error line is a failed alloc (a "
            "null handle), the symptom what the server showed instead; give the one it showed"
        )
    try:
        return parse_symptom(raw)
    except SymptomError as e:
        raise RequestError(str(e)) from None


def _request_from_flags(args: argparse.Namespace) -> Request:
    symptom = _symptom(args)
    if symptom is not None:
        return dataclasses.replace(_request_of_flags(args), symptom=symptom)
    return _request_of_flags(args)


def _request_of_flags(args: argparse.Namespace) -> Request:
    line = _error_line(args)
    flags = dict(vars(args))  # the flags, with what the --error line gives (args stays as parsed)
    if line is not None:
        for dest in ("size", "backing", "numa_node"):
            given, said = flags.get(dest), getattr(line, dest)
            if given is None:
                flags[dest] = said
            elif given != said:  # another request than the one that failed: say so, not replay it
                shown = format_size(given) if dest == "size" else given
                raise RequestError(
                    f"{_flag(dest)} {shown}: the --error line says {dest.replace('_', ' ')} "
                    f"{said}; leave {_flag(dest)} out (the line gives it) or drop --error"
                )
    raw_given = [f for f in RAW_FLAGS if flags.get(f) not in (None, False)]
    sg_given = [f for f in SGLANG_FLAGS if flags.get(f) is not None]
    if line is not None and sg_given:
        raise RequestError(
            f"--error cannot be combined with {_flag(sg_given[0])}: the error line is the "
            "request, the one alloc call that failed (its size, backing and node); replay it "
            f"with --error alone (and --hugepage-size, --no-prefault), or the sglang startup "
            "without --error"
        )
    if raw_given and sg_given:
        raise RequestError(
            f"{_flag(raw_given[0])} cannot be combined with {_flag(sg_given[0])}: give a raw "
            "request (--size ...) or an sglang one (--model-layers ...), not both"
        )
    if not raw_given and not sg_given:
        raise RequestError(
            "no request: give --size (raw alloc) or --model-layers with the model's dims (sglang)"
        )
    if raw_given:
        env = _env(flags["env"])
        allocator_only = [k for k in env if k not in (*MORI_LOG_ENV, *DRAM_VARIABLES)]
        if allocator_only:
            raise RequestError(
                f"--env {allocator_only[0]}: applies to sglang requests only (raw requests take "
                "--backing/--hugepage-size/--numa-node/--no-prefault)"
            )
        size, node = flags["size"], flags["numa_node"]
        if size is None:
            raise RequestError(f"{_flag(raw_given[0])}: a raw request needs --size")
        hp = flags["hugepage_size"] if flags["hugepage_size"] is not None else 2 * MiB
        _check_hugepage_size(hp)
        if node is not None and node < -1:
            raise RequestError(f"--numa-node: {node} is not a node (or -1)")
        alloc = AllocRequest(
            size,
            flags["backing"] or "AnonymousHugetlb",
            hp,
            -1 if node is None else node,
            not flags["no_prefault"],
        )
        return Request(alloc, env=env, error_line=line)
    return Request(sglang=_sglang_table(args), env=_env(args.env))


def _sglang_table(args: argparse.Namespace) -> dict[str, Any]:
    if args.model_layers is None:
        raise RequestError("--model-layers: required for an sglang request")
    mla = args.kv_lora_rank is not None
    if mla and (args.kv_heads is not None or args.head_dim is not None):
        which = "--kv-heads" if args.kv_heads is not None else "--head-dim"
        raise RequestError(f"{which} cannot be combined with --kv-lora-rank (MHA vs MLA dims)")
    if not mla:
        for dest in ("kv_heads", "head_dim"):
            if getattr(args, dest) is None:
                raise RequestError(f"{_flag(dest)}: required for an MHA model (or --kv-lora-rank)")
        for dest in ("qk_rope_head_dim", "index_head_dim"):
            if getattr(args, dest) is not None:
                raise RequestError(f"{_flag(dest)}: MLA only (give --kv-lora-rank)")
    if args.hicache_size is None and args.device_pool_tokens is None:
        raise RequestError(
            "--hicache-size: required (or --device-pool-tokens with --hicache-ratio)"
        )
    table: dict[str, Any] = {"layers": args.model_layers}
    names = {
        "kv_heads": "kv_heads", "head_dim": "head_dim", "kv_lora_rank": "kv_lora_rank",
        "qk_rope_head_dim": "qk_rope_head_dim", "index_head_dim": "index_head_dim",
        "dtype": "dtype", "hicache_ratio": "hicache_ratio",
        "device_pool_tokens": "device_pool_tokens", "page_size": "page_size",
        "layout": "layout", "tp_size": "tp_size",
    }  # fmt: skip
    for dest, key in names.items():
        if getattr(args, dest) is not None:
            table[key] = getattr(args, dest)
    if args.hicache_size is not None:
        hs = args.hicache_size
        table["hicache_size"] = int(hs) if float(hs).is_integer() else hs
    req = Request(sglang=table)
    try:
        buffers = req.hicache().buffers
    except SizingError as e:
        msg = str(e)
        key, _, rest = msg.partition(": ")
        flag = {"layers": "--model-layers"}.get(key, _flag(key)) if rest else "request"
        raise RequestError(f"{flag}: {rest or msg}") from None
    for b in buffers:
        if b.nbytes >= MAX_BYTES:
            raise RequestError(
                f"request: a host buffer of {b.nbytes} bytes is beyond what the simulator "
                "holds (below 2^62 bytes)"
            )
    return table


_DECIMAL_TO_BINARY = {10**3: 1 << 10, 10**6: 1 << 20, 10**9: 1 << 30, 10**12: 1 << 40}


def _check_hugepage_size(hp: int) -> None:
    """A decimal unit on a hugepage size is a slip for the binary one: say which was meant."""
    unit = getattr(hp, "unit", "")
    per = unit_bytes(unit) if unit else None
    if hp & (hp - 1) and per in _DECIMAL_TO_BINARY and hp % per == 0:
        meant = format_size(hp // per * _DECIMAL_TO_BINARY[per])
        raise RequestError(
            f"--hugepage-size: {format_size(hp)} is {int(hp)} bytes ({unit} is decimal); "
            f"hugepage sizes are binary: did you mean {meant}?"
        )


def _env(pairs: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise RequestError(f"--env {shown(pair)}: expected KEY=VALUE")
        if key not in ENV_VARIABLES:
            raise RequestError(f"--env {key}: not one of {', '.join(ENV_VARIABLES)}")
        _check_env_int(key, value)
        out[key] = value
    try:
        dram_tier_request(out)
    except DramTierError as e:
        raise RequestError(f"--env {e}") from None
    return out


def _check_env_int(key: str, value: str) -> None:
    """An integer sglang would read but the allocator (a C int, a size below 2**62) cannot
    take. Non-integers are left to the replay: sglang dies on them, which is the answer."""
    text = value.strip()
    if key not in (sgenv.NUMA_NODE, sgenv.HUGEPAGE_SIZE) or len(text) > 40:
        return
    try:
        n = int(text)
    except ValueError:
        return
    top = MAX_INT if key == sgenv.NUMA_NODE else MAX_BYTES - 1
    if not -(MAX_INT + 1) <= n <= top:
        raise RequestError(f"--env {key}={text}: beyond what the allocator takes (at most {top})")
