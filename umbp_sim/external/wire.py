"""The encoding of the external protocols' messages: plain data, decoded within fixed bounds.

A message between umbp-sim, an allocator's server and a run's child (``umbp_sim.external.child``)
is a JSON document in a frame (``procs.frame``). Allocator code runs in the server and in the
child and can write anything on their fds, so what umbp-sim decodes must be data that cannot act
or grow: pickle cannot be made so (its opcodes call what the frame names, ``bytearray(6 GiB)``,
``Fraction("1e1000000000")``, and a pre-scan of them is a second unpickler to get right). Here:

- **before anything is built**: the frame is at most ``procs.MAX_FRAME`` bytes, valid UTF-8, and
  holds at most ``MAX_VALUES`` values (counted from its ``[``, ``{``, ``,`` and ``:`` bytes, an
  upper bound); the JSON decoder then builds plain values only (lists, dicts, str, int, float,
  bool, None), each integer at most ``MAX_INT_DIGITS`` digits and within ``MAX_INT``, each float
  finite and short (NaN and Infinity refused), its nesting bounded by the decoder's own
  recursion guard;
- **then** those plain values are turned into the message, at most ``MAX_DEPTH`` deep, by the
  tags below. A tagged object names a class by module and name; it is taken only from
  ``umbp_sim``'s own modules (imported as pickle's lookup would) and only if it is a dataclass,
  an exception, or a subclass of int, str, float or tuple (``units.Size``, ``dump.notes.Note``).
  Nothing the frame names is called: an instance is made by ``object.__new__`` (or the builtin
  base's ``__new__``: ``Size.__new__`` and ``Note.__new__`` do not run) and its attributes put
  in its ``__dict__`` (a slot by its member descriptor). No ``__init__``, ``__post_init__``,
  ``__setstate__``, ``__hash__`` or ``__eq__`` of the frame's choosing runs: dict keys and set
  members may only be str, int, bool, None, bytes and tuples of these (and subclasses of int and
  str that keep the builtin's hash and equality).

The tags (a JSON object of one key): ``{"t": [...]}`` tuple, ``{"d": [k, v, ...]}`` dict,
``{"s": [...]}`` set, ``{"z": [...]}`` frozenset, ``{"b": "hex"}`` bytes, ``{"f": "inf"}`` a
float that JSON cannot hold, ``{"o": [module, name, [attr, value, ...]]}`` an instance of a
dataclass, ``{"v": [module, name, value, [attr, value, ...]]}`` an int/str/float/tuple subclass,
``{"x": [module, name, [args], [attr, value, ...]]}`` an exception. A list is a JSON array; a
str, int, float, bool and None are themselves.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
import sys
import types
from typing import Any

from umbp_sim.vocabulary.bounded import shown

MAX_VALUES = 1 << 21  # values in one message: a run's record with a 100,000-call trace is ~10^5
MAX_DEPTH = 200  # nesting of the plain values (a record with its host state: ~30)
MAX_INT = 1 << 64  # |int| below it: sizes, addresses, counters (an unsigned 64-bit value)
MAX_INT_DIGITS = 21  # decimal digits of an int, checked before it is converted
MAX_FLOAT_CHARS = 32  # a float's text (repr gives at most 24)

_MODULE = re.compile(r"umbp_sim(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
_PLAIN = (str, int, float, bool, type(None))


class WireError(ValueError):
    """A payload that is not a message of umbp-sim's: the text says what is wrong."""


# ---- encoding (what umbp-sim and its own processes send) ---------------------------------------


def encode(obj: Any) -> bytes:
    """``obj`` as a message payload; TypeError for a value the protocol does not carry."""
    return json.dumps(_enc(obj), separators=(",", ":"), allow_nan=False).encode()


def _enc(x: Any) -> Any:
    t = type(x)
    if t is str or t is bool or x is None:
        return x
    if t is int:
        if not -MAX_INT < x < MAX_INT:
            raise TypeError(f"an int of {x.bit_length()} bits: past the protocol's bound")
        return x
    if t is float:
        return x if x - x == 0 else {"f": repr(x)}  # inf - inf and nan - nan are nan
    if t is list:
        return [_enc(v) for v in x]
    if t is tuple:
        return {"t": [_enc(v) for v in x]}
    if t is dict:
        return {"d": [_enc(v) for kv in x.items() for v in kv]}
    if t is set:
        return {"s": [_enc(v) for v in x]}
    if t is frozenset:
        return {"z": [_enc(v) for v in x]}
    if t is bytes:
        return {"b": x.hex()}
    if isinstance(x, BaseException):
        return {"x": [t.__module__, t.__qualname__, [_enc(a) for a in x.args], _state(x)]}
    if isinstance(x, (int, str, float, tuple)):
        base: Any = _builtin_base(t)
        value = [_enc(v) for v in x] if base is tuple else _enc(base(x))  # type: ignore[union-attr]
        return {"v": [t.__module__, t.__qualname__, value, _state(x)]}
    if dataclasses.is_dataclass(t):
        return {"o": [t.__module__, t.__qualname__, _state(x)]}
    raise TypeError(f"a {t.__module__}.{t.__qualname__}, which the protocol does not carry")


_SLOTS: dict[type, tuple[str, ...]] = {}  # umbp-sim's own classes' slots, found once


def _state(x: Any) -> list[Any]:
    """The instance's attributes as [name, value, ...]: its ``__dict__`` and its slots."""
    out: list[Any] = []
    for name, value in getattr(x, "__dict__", {}).items():
        out += [name, _enc(value)]
    t = type(x)
    slots = _SLOTS.get(t)
    if slots is None:
        names: list[str] = []
        for cls in t.__mro__:
            own = cls.__dict__.get("__slots__", ())
            names += [own] if isinstance(own, str) else list(own)
        slots = _SLOTS[t] = tuple(n for n in names if n not in ("__dict__", "__weakref__"))
    for name in slots:
        if hasattr(x, name):
            out += [name, _enc(getattr(x, name))]
    return out


def _builtin_base(cls: type) -> type:
    for base in (bool, int, float, str, tuple):
        if issubclass(cls, base):
            return base
    raise TypeError(cls)


# ---- decoding (what umbp-sim reads: written by whoever holds the fd) --------------------------


def decode(payload: bytes) -> Any:
    """The message of ``payload``; WireError, one line, for anything else."""
    doc = plain(payload)
    try:
        return _dec(doc, 0)
    except WireError:
        raise
    except (TypeError, ValueError, AttributeError, RecursionError) as e:
        # A class that cannot be made this way (an exception with a C layout): refused.
        raise WireError(f"a message that is no umbp-sim data ({type(e).__name__})") from None


def plain(payload: bytes) -> Any:
    """``payload`` as plain JSON values, within the bounds above (the first step of ``decode``;
    the interposer's evidence frames, ``umbp_sim.external.evidence``, are read with it too);
    WireError, one line, for anything else."""
    values = 1 + sum(payload.count(c) for c in (b"[", b"{", b",", b":"))
    if values > MAX_VALUES:
        raise WireError(f"a message of more than {MAX_VALUES:,} values")
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        raise WireError("a message that is not UTF-8 text") from None
    try:
        return json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except WireError:
        raise
    except RecursionError:
        raise WireError(f"a message nested deeper than {MAX_DEPTH}") from None
    except ValueError as e:  # JSONDecodeError: its position, not the text
        raise WireError(f"a message that is not JSON ({type(e).__name__})") from None


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise WireError(f"a message with an integer of {len(text):,} digits")
    value = int(text)
    if not -MAX_INT < value < MAX_INT:
        raise WireError("a message with an integer past 2^64")
    return value


def _float(text: str) -> float:
    if len(text) > MAX_FLOAT_CHARS:
        raise WireError(f"a message with a number of {len(text):,} characters")
    value = float(text)
    if value - value != 0:
        raise WireError("a message with a number past a float's range")
    return value


def _constant(text: str) -> Any:
    raise WireError(f"a message with {text}, which is no number")


def _dec(x: Any, depth: int) -> Any:
    if isinstance(x, _PLAIN):
        return x
    if depth >= MAX_DEPTH:
        raise WireError(f"a message nested deeper than {MAX_DEPTH}")
    d = depth + 1
    if type(x) is list:
        return [v if type(v) in _PLAIN_TYPES else _dec(v, d) for v in x]
    if len(x) != 1:
        raise WireError("a message with an object that is not one tagged value")
    ((tag, body),) = x.items()
    if tag == "t":
        return tuple(_dec(v, d) for v in _list(body))
    if tag == "d":
        items = _list(body)
        if len(items) % 2:
            raise WireError("a message with a dict of an odd number of entries")
        out: dict[Any, Any] = {}
        for i in range(0, len(items), 2):
            out[_key(_dec(items[i], d))] = _dec(items[i + 1], d)
        return out
    if tag == "s":
        return {_key(_dec(v, d)) for v in _list(body)}
    if tag == "z":
        return frozenset(_key(_dec(v, d)) for v in _list(body))
    if tag == "b":
        try:
            return bytes.fromhex(_str(body))
        except ValueError:
            raise WireError("a message with bytes that are not hex") from None
    if tag == "f":
        if body not in ("inf", "-inf", "nan"):
            raise WireError("a message with a float tag of no float")
        return float(body)
    if tag == "o":
        module, name, state = _fields(body, 3)
        cls = _class(module, name)
        if not dataclasses.is_dataclass(cls) or cls.__new__ is not object.__new__:
            raise WireError(f"a message naming {module}.{name}, which is no umbp-sim data")
        return _fill(object.__new__(cls), state, d)
    if tag == "v":
        module, name, value, state = _fields(body, 4)
        return _value(module, name, value, state, d)
    if tag == "x":
        module, name, args, state = _fields(body, 4)
        cls = _class(module, name)
        if not issubclass(cls, BaseException):
            raise WireError(f"a message naming {module}.{name} as an exception")
        exc = BaseException.__new__(cls)
        exc.args = tuple(_dec(a, d) for a in _list(args))
        return _fill(exc, state, d)
    raise WireError("a message with an object of an unknown tag")


def _value(module: Any, name: Any, value: Any, state: Any, depth: int) -> Any:
    """An instance of an int/str/float/tuple subclass of umbp_sim's, made by the builtin's
    ``__new__`` (the class's own is not called)."""
    cls: Any = _class(module, name)
    if not issubclass(cls, (int, str, float, tuple)) or issubclass(cls, bool):
        raise WireError(f"a message naming {module}.{name} as a value type")
    base: Any = _builtin_base(cls)
    value = _dec(value, depth)
    if base is tuple:
        obj = base.__new__(cls, _list(value))
    elif type(value) is not base and not (base is float and type(value) is int):
        raise WireError(f"a message with a {module}.{name} of a {type(value).__name__}")
    else:
        obj = base.__new__(cls, value)
    return _fill(obj, state, depth)


def _list(x: Any) -> list[Any]:
    if type(x) is not list:
        raise WireError("a message with a tag whose value is not a list")
    return x


def _str(x: Any) -> str:
    if type(x) is not str:
        raise WireError("a message with a tag whose value is not a string")
    return x


def _fields(body: Any, n: int) -> list[Any]:
    items = _list(body)
    if len(items) != n:
        raise WireError("a message with a tagged object of the wrong shape")
    return items


# No float: many floats share a hash, and a dict of them would take quadratic time to build.
_KEY = (str, int, bool, type(None), bytes)
_KEY_HASH = (str.__hash__, int.__hash__)
_KEY_EQ = (str.__eq__, int.__eq__)


def _key(k: Any) -> Any:
    """``k`` if hashing and comparing it runs no code of a class the frame chose."""
    t = type(k)
    if t is tuple:
        for v in k:
            _key(v)
        return k
    if t in _KEY or (isinstance(k, (int, str)) and t.__hash__ in _KEY_HASH
                     and t.__eq__ in _KEY_EQ):  # fmt: skip
        return k
    raise WireError(f"a message with a {t.__name__} as a key")


# What a lookup found, kept (a run's messages name the same few classes and attributes again and
# again), at most _CACHE_MAX entries each: a frame naming many cannot grow them without bound.
_CACHE_MAX = 4096
_CLASSES: dict[tuple[str, str], Any] = {}
_ATTRS: dict[tuple[type, str], Any] = {}  # (class, attribute) -> its slot's descriptor, or None
_PLAIN_TYPES = frozenset(_PLAIN)


def _class(module: Any, name: Any) -> type:
    """The class ``module.name`` of umbp_sim's own (its module imported, as pickle's would be)."""
    found = _CLASSES.get((module, name)) if type(module) is str and type(name) is str else None
    if found is not None:
        return found  # type: ignore[no-any-return]
    module, name = _str(module), _str(name)
    if not _MODULE.match(module) or module.endswith("__main__") or not _NAME.match(name):
        what = f"{module}.{name}" if _DOTTED.match(module) and _NAME.match(name) else "a class"
        raise WireError(f"a message naming {shown(what)[1:-1]}, which is no umbp-sim data")
    mod = sys.modules.get(module)
    if mod is None:
        try:
            mod = importlib.import_module(module)
        except ImportError:
            raise WireError(
                f"a message naming {module}.{name}, which is no umbp-sim data"
            ) from None
    cls: Any = mod.__dict__.get(name)
    own = cls.__module__ if isinstance(cls, type) else ""
    if own != "umbp_sim" and not own.startswith("umbp_sim."):
        raise WireError(f"a message naming {module}.{name}, which is no umbp-sim data")
    if len(_CLASSES) < _CACHE_MAX:
        _CLASSES[(module, name)] = cls
    return cls  # type: ignore[no-any-return]


def _fill(obj: Any, state: Any, depth: int) -> Any:
    """``obj`` with the attributes [name, value, ...] put in its ``__dict__`` or its slots."""
    items = _list(state)
    if len(items) % 2:
        raise WireError("a message with an object of an odd number of attributes")
    own = getattr(obj, "__dict__", None)
    cls = type(obj)
    for i in range(0, len(items), 2):
        name = items[i]
        key = (cls, name) if type(name) is str else None
        if key is None or key not in _ATTRS:
            name = _str(name)
            if not _NAME.match(name) or name.startswith("__"):
                raise WireError(f"a message with an attribute named {shown(name)}")
            found = getattr(cls, name, None)
            slot = found if isinstance(found, types.MemberDescriptorType) else None
            if len(_ATTRS) < _CACHE_MAX:
                _ATTRS[(cls, name)] = slot
        else:
            slot = _ATTRS[key]
        value = items[i + 1]
        if type(value) not in _PLAIN_TYPES:
            value = _dec(value, depth)
        if slot is not None:
            slot.__set__(obj, value)
        elif own is not None:
            own[name] = value
        else:
            raise WireError(f"a message with an attribute {name!r} its object cannot hold")
    return obj
