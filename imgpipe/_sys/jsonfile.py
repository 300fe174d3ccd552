"""The one reader of the JSON files imgpipe writes and reads back (journals, manifests, checkpoints, cache state).

``json.loads`` alone lets ``Infinity``, ``NaN`` and ``1e400`` through as floats, keeps the last of a key given
twice, raises RecursionError on arrays nested thousands deep, and leaves wrong types to fail later as TypeError
or OverflowError. Here any
bytes that are not what imgpipe wrote, and any value not of the declared types, are one error that names
the file, what is wrong and what to do.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import types
import typing
from typing import Any, Callable, TypeVar

from imgpipe._sys.regular import read_regular

T = TypeVar("T")


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """The value of JSON text ``data``; a ValueError with a short reason for anything else (never another exception)."""
    try:
        text = data if isinstance(data, str) else bytes(data).decode("utf-8")
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float, object_pairs_hook=_unique_keys)
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text: byte 0x{e.object[e.start]:02x} at {e.start}") from None
    except RecursionError:
        raise ValueError("not valid JSON: nested too deep") from None
    except ValueError as e:
        if str(e).startswith("Exceeds the limit"):  # an integer of thousands of digits
            raise ValueError("not valid JSON: a number of thousands of digits") from None
        raise ValueError(f"not valid JSON: {e}") from None


def parse_json(
    data: bytes | bytearray | memoryview | str,
    where: object,
    what: str,
    fix: str,
    error: Callable[[str], Exception],
    into: Callable[[Any], T] | None = None,
) -> T:
    """``into(loads(data))`` (``into`` raises ValueError for a value of the wrong shape); else one ``error``:
    ``{where}: unreadable {what} ({why}); {fix}``."""
    try:
        value = loads(data)
        return into(value) if into is not None else value
    except ValueError as e:
        raise error(f"{where}: unreadable {what} ({e}); {fix}") from None


def read_json(path: str | os.PathLike, what: str, fix: str, error: Callable[[str], Exception], into: Callable[[Any], T] | None = None) -> T:
    """``parse_json`` of the regular file at ``path``. FileNotFoundError and NotADirectoryError pass through (the
    caller knows what a missing file means); any other OSError (a FIFO or a device there too) is one ``error`` as well."""
    try:
        data = read_regular(path)
    except (FileNotFoundError, NotADirectoryError):
        raise
    except OSError as e:
        raise error(f"{path}: cannot read the {what} ({e.strerror or e}); {fix}") from None
    return parse_json(data, path, what, fix, error, into)


def as_dataclass(cls: type[T], value: Any) -> T:
    """``cls(**value)`` for a JSON object holding ``cls``'s fields (those with defaults may be left out), each of
    its annotated type (an ``int`` is never a bool or a float, a ``tuple`` comes as a list); else a ValueError
    naming the first field that is not."""
    if not isinstance(value, dict):
        raise ValueError(f"{_show(value)} is not an object of {cls.__name__} fields")
    hints, required = _fields(cls)
    unknown = sorted(set(value) - set(hints))
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r}")
    missing = sorted(required - set(value))
    if missing:
        raise ValueError(f"no {missing[0]!r}")
    for name, item in value.items():
        _check(item, hints[name], name)
    return cls(**value)


@functools.lru_cache(maxsize=None)
def _fields(cls: type) -> tuple[dict[str, Any], frozenset[str]]:
    """A dataclass's field types, and the names of the fields without a default."""
    fields = dataclasses.fields(cls)
    required = frozenset(f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields}, required


def _check(value: Any, hint: Any, name: str) -> None:
    """A ValueError naming ``name`` (or the item inside it) unless ``value``, decoded JSON, has the type ``hint``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        fits = any(_fits(value, arg) for arg in args)
    elif origin in (list, tuple):
        fits = isinstance(value, list) and (origin is list or len(value) == len(args))
        if fits and not (args == (int,) and all(type(item) is int for item in value)):  # a list of ints at C speed
            for k, item in enumerate(value):
                _check(item, args[0] if origin is list else args[k], f"{name}[{k}]")
    elif origin is dict:
        fits = isinstance(value, dict)
        if fits:
            for key, item in value.items():
                _check(item, args[1], f"{name}[{key!r}]")
    elif hint is Any:
        fits = True
    elif hint is type(None):
        fits = value is None
    elif hint is float:
        fits = type(value) in (int, float)
    else:  # int (never a bool), str, bool, a bare dict or list
        fits = type(value) is hint
    if not fits:
        raise ValueError(f"{name} is {_show(value)}, not {_name(hint)}")


def _fits(value: Any, hint: Any) -> bool:
    try:
        _check(value, hint, "")
    except ValueError:
        return False
    return True


def _name(hint: Any) -> str:
    if hint is type(None):
        return "null"
    return hint.__name__ if isinstance(hint, type) and typing.get_origin(hint) is None else str(hint).replace("typing.", "")


def _show(value: Any) -> str:
    text = "null" if value is None else repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys differ (json.loads alone keeps the last of a key given twice)."""
    value: dict[str, Any] = {}
    for key, item in pairs:
        if key in value:
            raise ValueError(f"key {_show(key)} twice")
        value[key] = item
    return value


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number imgpipe writes")


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text} is out of range")
    return number
