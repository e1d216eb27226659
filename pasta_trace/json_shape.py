"""The JSON documents of captures and timelines (manifest.json, timeline.json):
read with a size bound, decoded, and checked against the shape schema/
declares for them, so that readers can trust the type of every key they use.

A shape is a Python type (str, int, bool), [shape] for an array of such
values, or {key: shape} for an object whose other keys are free.  Any key
may be missing or null (readers fall back to their defaults); array elements
may not be null.
"""

from __future__ import annotations

import json
from pathlib import Path

from .errors import FormatError
from .regular_file import read_limited

#: More than any manifest or timeline header holds (a few KiB; a system-wide
#: capture of thousands of processes stays far below): the bound keeps a
#: huge or endless file from being read whole.
MAX_BYTES = 16 << 20

_NAMES = {dict: "an object", list: "an array", str: "a string", bool: "true or false", int: "an integer",
          float: "a number", type(None): "null"}


#: the integers a document may hold where its shape says int (int64)
INT_MIN, INT_MAX = -(1 << 63), (1 << 63) - 1


def _what(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and not INT_MIN <= value <= INT_MAX:
        return "an integer beyond 64 bits"
    return _NAMES.get(type(value), type(value).__name__)


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _expected(shape: object) -> str:
    if isinstance(shape, dict):
        return "an object"
    if isinstance(shape, list):
        return "an array"
    return _NAMES[shape]  # type: ignore[index]


def _matches(value: object, shape: object) -> bool:
    if isinstance(shape, dict):
        return isinstance(value, dict)
    if isinstance(shape, list):
        return isinstance(value, list)
    if shape is int:
        # bool is an int to Python, never to a reader of counts; an integer is
        # a count or a nanosecond time, which Polars and the tools hold in 64 bits
        return isinstance(value, int) and not isinstance(value, bool) and INT_MIN <= value <= INT_MAX
    return isinstance(value, shape)  # type: ignore[arg-type]


def shape_problem(value: object, shape: object, where: str) -> str | None:
    """Where `value` departs from `shape` first, as "KEY is X, expected Y"; None when it fits."""
    if not _matches(value, shape):
        return f"{where} is {_what(value)}, expected {_expected(shape)}"
    if isinstance(shape, dict):
        for key, sub in shape.items():
            v = value.get(key)  # type: ignore[union-attr]
            found = None if v is None else shape_problem(v, sub, f"{where}.{key}")
            if found:
                return found
    elif isinstance(shape, list):
        for i, v in enumerate(value):  # type: ignore[arg-type]
            found = shape_problem(v, shape[0], f"{where}[{i}]")
            if found:
                return found
    return None


def load_json(path: Path, what: str) -> dict:
    """The JSON object in `path`.  FormatError (one line, naming the file) for
    anything else: not a regular file, too large, not UTF-8, not JSON, nested
    too deeply, or not an object."""
    data = read_limited(path, MAX_BYTES, what)
    try:
        # NaN and Infinity are Python's extensions, never in what pasta-trace writes
        doc = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError as e:
        raise FormatError(f"{path}: damaged {what} (not UTF-8 at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise FormatError(f"{path}: damaged {what} ({e.msg} at line {e.lineno})") from None
    except RecursionError:
        raise FormatError(f"{path}: damaged {what} (nested too deeply)") from None
    except ValueError as e:  # an integer of more digits than Python converts
        raise FormatError(f"{path}: damaged {what} ({str(e).splitlines()[0]})") from None
    check_shape(doc, {}, path, what)
    return doc


def check_shape(doc: object, shape: dict, path: Path, what: str) -> None:
    """FormatError naming the first key of `doc` whose value does not fit `shape`."""
    found = shape_problem(doc, shape, "it")
    if found is not None:
        raise FormatError(f"{path}: not a pasta-trace {what} ({found.removeprefix('it.')})")
