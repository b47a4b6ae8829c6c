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

from umbp_sim.comparison.differences import CLASSES, Comparison
from umbp_sim.errors import UmbpSimError
from umbp_sim.vocabulary.bounded import short_list, shown
from umbp_sim.vocabulary.exit_codes import EX_DATAERR, EX_USAGE

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


class ShardDataError(ShardError):
    """A --merge file that is a shard's JSON but whose contents are not a shard's: the message
    names the file and the field (exit 65, bad input data)."""

    exit_code = EX_DATAERR


# What a shard may hold, checked before anything is built from its numbers. A shard of the full
# matrix run on one machine is about 80 MiB and 1.5 million JSON values; a run label is about
# 150 characters, an allocator's warning line rarely 1,000.
MAX_JSON_VALUES = 8_000_000  # commas, brackets and braces in the file: its values, at most
MAX_RUNS = 10_000_000  # the length of the whole run list
MAX_SHARDS = 999_999  # --shard's N (parse_shard)
MAX_TEXT = 1 << 20  # characters in any string
MAX_DEPTH = 4  # a difference's value: a string, a count, a list of texts, {"mappings": N, ...}
MAX_INT = 1 << 64  # a size, a count, an alignment
MAX_SPEC = 4096  # an allocator: a name, a module or a path (PATH_MAX)
_KEYS = frozenset({"a", "b", "runs", "differing_runs", "same", "differences", "shard"})
_SHARD_KEYS = frozenset({"k", "n", "total", "digest"})
_ITEM_KEYS = frozenset({"run", "index", "a", "b", "texts_a", "texts_b", "where"})
_DIGEST = re.compile(r"[0-9a-f]{16}")


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _load(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SHARD_FILE + 1)
    except OSError as e:
        raise ShardError(f"--merge {path}: {e.strerror}") from None
    if len(data) > MAX_SHARD_FILE:
        raise ShardError(f"--merge {path}: larger than {MAX_SHARD_FILE >> 20} MiB: not a shard")
    values = data.count(b",") + data.count(b"[") + data.count(b"{")
    if values > MAX_JSON_VALUES:  # bounds what json.loads builds, before it builds it
        raise ShardDataError(
            f"--merge {path}: more than {MAX_JSON_VALUES:,} JSON values: not a shard"
        )
    try:
        doc = json.loads(data, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:
        raise ShardDataError(f"--merge {path}: not JSON ({e})") from None
    shard = doc.get("shard") if isinstance(doc, dict) else None
    if not isinstance(shard, dict):
        raise ShardError(
            f"--merge {path}: not the JSON of a shard (compare ... --shard K/N --json)"
        )
    _check(path, doc)
    return doc


def _bad(path: str, name: str, value: Any, expected: str) -> ShardDataError:
    return ShardDataError(f"--merge {path}: {name} is {shown(value)}: expected {expected}")


def _int(path: str, name: str, value: Any, low: int, high: int, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise _bad(path, name, value, f"{what} from {low:,} to {high:,}")
    return value


def _text(path: str, name: str, value: Any, limit: int = MAX_TEXT) -> str:
    if not isinstance(value, str) or not value or len(value) > limit:
        raise _bad(path, name, value, f"a string of 1 to {limit:,} characters")
    return value


def _keys(path: str, name: str, doc: dict[str, Any], allowed: frozenset[str]) -> None:
    for key in doc:
        if key not in allowed:
            raise ShardDataError(f"--merge {path}: {name}{shown(key)}: not a field of a shard")


def _plain(path: str, name: str, value: Any, depth: int = 0) -> None:
    """``value`` (a difference's a or b) is a plain JSON value within the bounds."""
    if depth > MAX_DEPTH:
        raise _bad(path, name, value, f"a value nested at most {MAX_DEPTH} deep")
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if not -MAX_INT < value < MAX_INT:
            raise _bad(path, name, value, "an integer of at most 64 bits")
    elif isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise _bad(path, name, value, f"a string of at most {MAX_TEXT:,} characters")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _plain(path, f"{name}[{i}]", v, depth + 1)
    elif isinstance(value, dict):
        for k, v in value.items():
            _plain(path, f"{name}.{k}" if len(k) <= 40 else f"{name}.{k[:40]}...", v, depth + 1)
    else:  # a float: no difference is one
        raise _bad(path, name, value, "a string, an integer, a list or an object")


def _check(path: str, doc: dict[str, Any]) -> None:
    """``doc`` is what ``compare --shard K/N --json`` writes: its schema and types, its counts
    against its items, every bound; ShardDataError naming the field otherwise."""
    _keys(path, "", doc, _KEYS)
    shard = doc["shard"]
    _keys(path, "shard.", shard, _SHARD_KEYS)
    n = _int(path, "shard.n", shard.get("n"), 1, MAX_SHARDS, "a number of shards")
    k = _int(path, "shard.k", shard.get("k"), 1, n, "the shard's number")
    total = _int(path, "shard.total", shard.get("total"), 0, MAX_RUNS, "a number of runs")
    digest_ = shard.get("digest")
    if not isinstance(digest_, str) or not _DIGEST.fullmatch(digest_):
        raise _bad(path, "shard.digest", digest_, "16 hexadecimal digits")
    for side in ("a", "b"):
        _text(path, side, doc.get(side), MAX_SPEC)
    share = len(range(k - 1, total, n))  # the runs at places k-1, k-1+n, ... of the whole list
    runs = doc.get("runs")
    if runs != share or not isinstance(runs, int) or isinstance(runs, bool):
        raise _bad(path, "runs", runs, f"{share:,} (shard {k} of {n} of {total:,} runs)")
    differing = _int(path, "differing_runs", doc.get("differing_runs"), 0, runs,
                     "a number of runs")  # fmt: skip
    if "same" in doc and doc["same"] is not (differing == 0):
        raise _bad(path, "same", doc["same"], f"{differing == 0} (differing_runs {differing})")
    differences = doc.get("differences")
    if not isinstance(differences, dict):
        raise _bad(path, "differences", differences, "an object of classes of difference")
    labels: dict[int, str] = {}
    for cls, items in differences.items():
        if cls not in CLASSES:
            raise ShardDataError(f"--merge {path}: {shown(cls)} is not a class of difference")
        where = f"differences.{cls}"
        if not isinstance(items, list):
            raise _bad(path, where, items, "a list of differing runs")
        if len(items) > differing:
            raise ShardDataError(f"--merge {path}: {where}: {len(items):,} runs, more than its "
                                 f"differing_runs ({differing:,})")  # fmt: skip
        seen: set[int] = set()
        for i, item in enumerate(items):
            _item(path, f"{where}[{i}]", item, cls, k, n, total)
            index, label = item["index"], item["run"]
            if index in seen:
                raise _bad(path, f"{where}[{i}].index", index, "each run once in a class")
            seen.add(index)
            if labels.setdefault(index, label) != label:
                raise _bad(path, f"{where}[{i}].run", label, f"{shown(labels[index])}, the "
                           f"label of run {index} in another class")  # fmt: skip
    if len(labels) != differing:
        raise _bad(path, "differing_runs", differing,
                   f"{len(labels):,}, the runs its differences list")  # fmt: skip


def _item(path: str, name: str, item: Any, cls: str, k: int, n: int, total: int) -> None:
    """One differing run of a class: {run, index, a, b} (a warning count's: texts_a, texts_b)."""
    if not isinstance(item, dict):
        raise _bad(path, name, item, "an object {run, index, a, b}")
    _keys(path, f"{name}.", item, _ITEM_KEYS)
    _text(path, f"{name}.run", item.get("run"))
    index = _int(path, f"{name}.index", item.get("index"), 0, max(total - 1, 0), "a place")
    if index % n != k - 1 or index >= total:
        raise _bad(path, f"{name}.index", index, f"a place of shard {k} of {n} (k-1, k-1+n, ...)")
    for side in ("a", "b"):
        if side not in item:
            raise ShardDataError(f"--merge {path}: {name}.{side}: missing")
        _plain(path, f"{name}.{side}", item[side])
    if "where" in item:
        _where(path, f"{name}.where", item["where"])
    texts = ("texts_a", "texts_b")
    if cls != "warning count":
        if any(t in item for t in texts):
            raise ShardDataError(f"--merge {path}: {name}: texts only in a warning count")
        return
    for side, key in zip(("a", "b"), texts, strict=True):
        count = _int(path, f"{name}.{side}", item[side], 0, MAX_JSON_VALUES, "a count")
        lines = item.get(key)
        if not isinstance(lines, list) or len(lines) != count:
            raise _bad(path, f"{name}.{key}", lines, f"a list of {count:,} warning texts")
        for j, line in enumerate(lines):
            if not isinstance(line, str) or len(line) > MAX_TEXT:
                raise _bad(path, f"{name}.{key}[{j}]", line,
                           f"a string of at most {MAX_TEXT:,} characters")  # fmt: skip


_WHERE_KEYS = frozenset({"call", "same_calls", "a", "b", "site_a", "site_b", "leaks_a", "leaks_b"})
_LEAK_KEYS = frozenset({"what", "call_number", "call", "site"})


def _where(path: str, name: str, where: Any) -> None:
    """A class's first run's ``where`` (``umbp_sim.comparison.divergence``): its fields, the
    calls as lists of strings, every value plain and bounded (the report prints them)."""
    if not isinstance(where, dict):
        raise _bad(path, name, where, "an object {call, a, b, site_a, site_b, ...}")
    _keys(path, f"{name}.", where, _WHERE_KEYS)
    for side in ("a", "b"):
        calls = where.get(side, [])
        if not isinstance(calls, list) or not all(isinstance(c, str) for c in calls):
            raise _bad(path, f"{name}.{side}", calls, "a list of calls")
        leaks = where.get(f"leaks_{side}", [])
        if not isinstance(leaks, list):
            raise _bad(path, f"{name}.leaks_{side}", leaks, "a list of leaks")
        for i, leak in enumerate(leaks):
            if not isinstance(leak, dict) or not isinstance(leak.get("what"), str):
                raise _bad(path, f"{name}.leaks_{side}[{i}]", leak, "an object {what, call, ...}")
            _keys(path, f"{name}.leaks_{side}[{i}].", leak, _LEAK_KEYS)
            for key in ("call", "call_number"):
                if key not in leak:
                    raise ShardDataError(f"--merge {path}: {name}.leaks_{side}[{i}].{key}: missing")
    for key in ("call", "same_calls"):
        value = where.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise _bad(path, f"{name}.{key}", value, "a call number")
    _plain(path, name, where)


def merge(paths: Sequence[str]) -> Comparison:
    """The whole comparison from the JSON of each of its shards (every one, once), each checked
    (:func:`_check`) before anything is built from its numbers."""
    docs = [(p, _load(p)) for p in paths]
    first_path, first = docs[0]
    n, key = first["shard"]["n"], (first["a"], first["b"], first["shard"]["total"],
                                   first["shard"]["digest"])  # fmt: skip
    seen: dict[int, str] = {}
    for path, doc in docs:
        s = doc["shard"]
        if (doc["a"], doc["b"], s["total"], s["digest"]) != key or s["n"] != n:
            raise ShardError(
                f"--merge {path}: a shard of another comparison than {first_path} (allocators, "
                "run list or N differ)"
            )
        if s["k"] in seen:
            raise ShardError(f"--merge {path}: shard {s['k']}/{n} again (also {seen[s['k']]})")
        seen[s["k"]] = path
    if len(seen) != n:  # n is bounded; the shards given are fewer than n
        missing = (k for k in range(1, n + 1) if k not in seen)
        raise ShardError(f"--merge: shard(s) {short_list(missing)} of {n} missing")
    result = Comparison(first["a"], first["b"])
    indexed: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for _path, doc in docs:
        result.runs += doc["runs"]
        result.differing_runs += doc["differing_runs"]
        for cls, items in doc["differences"].items():
            for item in items:
                rest = {k: v for k, v in item.items() if k != "index"}
                indexed.setdefault(cls, []).append((item["index"], rest))
    for cls in CLASSES:
        if cls in indexed:
            items = [item for _i, item in sorted(indexed[cls], key=lambda t: t[0])]
            # each shard's first run of a class says where; the whole comparison's first does
            result.by_class[cls] = [items[0]] + [
                {k: v for k, v in item.items() if k != "where"} for item in items[1:]
            ]
    return result


def read_paths(paths: Sequence[str]) -> list[str]:
    """The --merge files as given (a directory is not a shard)."""
    for p in paths:
        if Path(p).is_dir():
            raise ShardError(f"--merge {p}: a directory; give the shards' JSON files")
    return list(paths)
