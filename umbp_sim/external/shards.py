"""``compare --shard K/N`` and ``compare --merge``: one comparison spread over machines.

A CI matrix runs ``compare A B --matrix full --shard K/N --json > shard-K.json`` on N machines;
``compare --merge shard-*.json`` gives the comparison one machine would have printed, byte for
byte (its JSON and its report, and its exit status). Shard K takes the runs at places K-1,
K-1+N, ... of the whole run list (after -k), so the shards share out the slow and the fast
runs; each shard's JSON says which shard it is, the length and a digest of the whole list
(shards of different lists, or of different allocators, are refused) and each differing run's
place in the list, by which the merge puts them back in order.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from umbp_sim.errors import UmbpSimError
from umbp_sim.exit_codes import EX_USAGE
from umbp_sim.external.compare import CLASSES, Comparison

T = TypeVar("T")
_SHARD = re.compile(r"([1-9][0-9]{0,5})/([1-9][0-9]{0,5})")
MAX_SHARD_FILE = 256 << 20  # a shard of the full matrix is a few MiB


class ShardError(UmbpSimError):
    """A bad --shard or --merge: the message names the argument or file."""

    exit_code = EX_USAGE


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/4"`` -> (2, 4); ShardError naming --shard otherwise."""
    m = _SHARD.fullmatch(text.strip())
    if not m or not 1 <= int(m[1]) <= int(m[2]):
        raise ShardError(f"--shard {text!r}: expected K/N with 1 <= K <= N (2/4: the second of 4)")
    return int(m[1]), int(m[2])


def digest(labels: Sequence[str]) -> str:
    """What identifies the whole run list: shards of one comparison share it."""
    h = hashlib.sha256()
    for label in labels:
        h.update(label.encode() + b"\n")
    return h.hexdigest()[:16]


def select(items: Sequence[T], k: int, n: int) -> list[T]:
    """Shard ``k`` of ``n``: the items at places k-1, k-1+n, ..."""
    return list(items[k - 1 :: n])


def shard_info(k: int, n: int, labels: Sequence[str]) -> dict[str, Any]:
    return {"k": k, "n": n, "total": len(labels), "digest": digest(labels)}


def _load(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SHARD_FILE + 1)
    except OSError as e:
        raise ShardError(f"--merge {path}: {e.strerror}") from None
    if len(data) > MAX_SHARD_FILE:
        raise ShardError(f"--merge {path}: larger than {MAX_SHARD_FILE >> 20} MiB: not a shard")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise ShardError(f"--merge {path}: not JSON ({e})") from None
    shard = doc.get("shard") if isinstance(doc, dict) else None
    if not isinstance(shard, dict) or not all(
        isinstance(shard.get(k), int) for k in ("k", "n", "total")
    ):
        raise ShardError(
            f"--merge {path}: not the JSON of a shard (compare ... --shard K/N --json)"
        )
    for key, kind in (("a", str), ("b", str), ("runs", int), ("differing_runs", int),
                      ("differences", dict)):  # fmt: skip
        if not isinstance(doc.get(key), kind) or isinstance(doc.get(key), bool):
            raise ShardError(f"--merge {path}: its {key!r} is missing or not a {kind.__name__}")
    return doc


def merge(paths: Sequence[str]) -> Comparison:
    """The whole comparison from the JSON of each of its shards (every one, once)."""
    docs = [(p, _load(p)) for p in paths]
    first_path, first = docs[0]
    n, key = first["shard"]["n"], (first["a"], first["b"], first["shard"]["total"],
                                   first["shard"].get("digest"))  # fmt: skip
    seen: dict[int, str] = {}
    for path, doc in docs:
        s = doc["shard"]
        if (doc["a"], doc["b"], s["total"], s.get("digest")) != key or s["n"] != n:
            raise ShardError(
                f"--merge {path}: a shard of another comparison than {first_path} (allocators, "
                "run list or N differ)"
            )
        if s["k"] in seen:
            raise ShardError(f"--merge {path}: shard {s['k']}/{n} again (also {seen[s['k']]})")
        seen[s["k"]] = path
    missing = [str(k) for k in range(1, n + 1) if k not in seen]
    if missing:
        raise ShardError(f"--merge: shard(s) {', '.join(missing)} of {n} missing")
    result = Comparison(first["a"], first["b"])
    indexed: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for path, doc in docs:
        result.runs += doc["runs"]
        result.differing_runs += doc["differing_runs"]
        for cls, items in doc["differences"].items():
            if cls not in CLASSES or not isinstance(items, list):
                raise ShardError(f"--merge {path}: {cls!r} is not a class of difference")
            for item in items:
                if not isinstance(item, dict) or not isinstance(item.get("index"), int):
                    raise ShardError(f"--merge {path}: a {cls} difference without its index")
                rest = {k: v for k, v in item.items() if k != "index"}
                indexed.setdefault(cls, []).append((item["index"], rest))
    if result.runs != first["shard"]["total"]:
        raise ShardError(
            f"--merge: the shards hold {result.runs} runs, the comparison {first['shard']['total']}"
        )
    for cls in CLASSES:
        if cls in indexed:
            result.by_class[cls] = [item for _i, item in sorted(indexed[cls], key=lambda t: t[0])]
    return result


def read_paths(paths: Sequence[str]) -> list[str]:
    """The --merge files as given (a directory is not a shard)."""
    for p in paths:
        if Path(p).is_dir():
            raise ShardError(f"--merge {p}: a directory; give the shards' JSON files")
    return list(paths)
