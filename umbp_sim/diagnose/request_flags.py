"""The request's command-line flags (``replay``, ``preflight``): what building their parser
needs and nothing more, so ``umbp-sim replay --help`` imports no simulator, no dump reader and
no sglang emulation. ``umbp_sim.diagnose.replay_request`` reads the parsed flags into a ``Request``.
"""

from __future__ import annotations

import argparse

from umbp_sim.allocator_profiles import FIELD_PROFILE, FIXED_PROFILE
from umbp_sim.allocator_spec import allocator_flag
from umbp_sim.sglang.release import SGLANG_RELEASES
from umbp_sim.vocabulary.flag_types import (
    count_flag,
    gb_flag,
    node_flag,
    ratio_flag,
    seconds_flag,
    size_flag,
)

BACKINGS = {
    "hugetlb": "AnonymousHugetlb",
    "anonymous": "Anonymous",
    "shm": "AnonymousShm",
    "shm-hugetlb": "AnonymousShmHugetlb",
}
_FLAG_OF = {v: k for k, v in BACKINGS.items()}


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _backing_arg(value: str) -> str:
    v = value.strip().removeprefix("UMBPHostBufferBacking.")
    if v.lower() in BACKINGS:
        return BACKINGS[v.lower()]
    if v in BACKINGS.values():
        return v
    raise argparse.ArgumentTypeError(
        f"unknown backing {shown(value)} (use {', '.join(BACKINGS)}, or the enum names)"
    )


MAX_RANKS = 64  # ranks on one host: 8 GPUs a node today; a bound on the simulation's work


def _ranks_arg(value: str) -> int:
    n = count_flag(value)
    if not 1 <= n <= MAX_RANKS:
        raise argparse.ArgumentTypeError(f"{n} ranks: give 1 to {MAX_RANKS}")
    return n


def _sglang_arg(value: str) -> str:
    if value in SGLANG_RELEASES:
        return value
    raise argparse.ArgumentTypeError(
        f"unknown sglang {shown(value)}: use one of {', '.join(SGLANG_RELEASES)}"
    )


def add_request_arguments(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("what the server runs")
    model.add_argument(
        "--allocator",
        type=allocator_flag,
        default=FIELD_PROFILE,
        metavar="NAME|PATH|MODULE",
        help=f"allocator profile: {FIELD_PROFILE} (default, alias mori: the field's) or "
        f"{FIXED_PROFILE} (mori plus umbp-sim's fixes); or an external build: a built .so with "
        "mori's Python API, or an importable module such as mori.umbp (runs in its own "
        "process under the interposer)",
    )
    model.add_argument(
        "--run-timeout",
        type=seconds_flag,
        default=None,
        metavar="SECONDS",
        help="an external --allocator: the time limit of each run and of its import (default "
        "60); past it the command stops with one line naming the stage (exit 75)",
    )
    model.add_argument(
        "--sglang",
        type=_sglang_arg,
        default=None,
        metavar="VERSION|installed",
        help="sglang release whose UMBPHostTensorAllocator runs: 'installed' (the sglang in "
        "this environment; the default when there is one) or "
        f"{', '.join(r for r in SGLANG_RELEASES if r != 'installed')} (umbp-sim's emulation)",
    )
    model.add_argument(
        "--ranks",
        type=_ranks_arg,
        default=None,
        metavar="N",
        help="sglang ranks on this host (1 to 64), each allocating its own pool of the request "
        "in turn from the same hugepage pools and MemAvailable, each running sglang's host "
        "check (default: --tp-size for an sglang request, else 1)",
    )
    model.add_argument(
        "--error",
        metavar="LINE|-",
        help="sglang's 'UMBPHostMemAllocator.alloc(N bytes) failed (...)' line, or - to read a "
        "pasted traceback from stdin: fills --size, --backing and --numa-node",
    )
    model.add_argument(
        "--symptom",
        metavar="SYMPTOM|LINE",
        help="what the server showed, made the question: SIGBUS (or 'Bus error'), oom-kill (or "
        "'Killed', the kernel's OOM line), demoted (or sglang's demotion warning, mori's "
        "MAP_HUGETLB fallback line); with the request (--size ... or the sglang model), not "
        "with --error. When the host as dumped does not give it, the hidden causes that do are "
        "searched in simulation (docs/symptoms.md)",
    )
    raw = parser.add_argument_group("raw request (UMBPHostMemAllocator.alloc)")
    raw.add_argument("--size", type=size_flag, help="bytes, or with a unit: 100000595968, 2GiB, "
                     "100GB (GB = 10^9, GiB = 2^30)")  # fmt: skip
    raw.add_argument("--backing", type=_backing_arg, help="hugetlb (default) | anonymous | shm | "
                     "shm-hugetlb")  # fmt: skip
    raw.add_argument("--hugepage-size", type=size_flag, help="default 2MiB")
    raw.add_argument("--numa-node", type=node_flag, help="node to bind to (default -1: none)")
    raw.add_argument("--no-prefault", action="store_true", help="do not prefault the buffer")
    sg = parser.add_argument_group("sglang request (HiCache host pool of one rank)")
    sg.add_argument("--model-layers", type=count_flag, help="layers of the model")
    sg.add_argument("--kv-heads", type=count_flag, help="MHA: KV heads of the model (all ranks)")
    sg.add_argument("--head-dim", type=count_flag, help="MHA: head dimension")
    sg.add_argument("--kv-lora-rank", type=count_flag, help="MLA: kv_lora_rank (DeepSeek: 512)")
    sg.add_argument(
        "--qk-rope-head-dim", type=count_flag, help="MLA: qk_rope_head_dim (default 64)"
    )
    sg.add_argument("--index-head-dim", type=count_flag, help="MLA: DSA indexer K width")
    sg.add_argument("--dtype", help="KV cache dtype (default bfloat16)")
    sg.add_argument("--hicache-size", type=gb_flag, help="GB per rank (sglang --hicache-size)")
    sg.add_argument("--hicache-ratio", type=ratio_flag, help="host/device ratio (default 2.0)")
    sg.add_argument(
        "--device-pool-tokens", type=count_flag, help="device pool tokens (with the ratio)"
    )
    sg.add_argument("--page-size", type=count_flag, help="sglang --page-size (default 1)")
    sg.add_argument("--layout", help="--hicache-mem-layout (default layer_first)")
    sg.add_argument("--tp-size", type=count_flag, help="tensor parallel size: KV heads are split")
    sg.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="K=V",
        help="SGLANG_HICACHE_HOST_*, UMBP_STANDALONE_ADDRESS, UMBP_DRAM_* (mori's DRAM tier: "
        "one more allocation in each rank) or MORI_*_LOG_LEVEL setting of the server "
        "(repeatable; raw requests take only the MORI_* and UMBP_DRAM_* ones)",
    )


def shown(value: object) -> str:
    """``umbp_sim.vocabulary.bounded.shown``, imported when an error is written (``--help`` stays
    light: tests/test_cli_imports.py)."""
    from umbp_sim.vocabulary.bounded import shown as bounded

    return bounded(value)
