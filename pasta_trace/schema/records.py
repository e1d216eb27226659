"""C types and the Record/Field machinery every binary layout is declared with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np
import polars as pl


CTYPES: dict[str, tuple[str, str, pl.DataType]] = {
    # name: (numpy dtype, C type, Polars type)
    "u8": ("<u1", "__u8", pl.UInt8),
    "u16": ("<u2", "__u16", pl.UInt16),
    "u32": ("<u4", "__u32", pl.UInt32),
    "u64": ("<u8", "__u64", pl.UInt64),
    "i32": ("<i4", "__s32", pl.Int32),
    "i64": ("<i8", "__s64", pl.Int64),
}


@dataclass(frozen=True)
class Field:
    name: str
    ctype: str  # a key of CTYPES, "char[N]" (a C string), or "<key>[N]" (an array of N)
    unit: str = ""
    doc: str = ""

    @property
    def _array(self) -> tuple[str, int] | None:
        base, sep, rest = self.ctype.partition("[")
        return (base, int(rest[:-1])) if sep else None

    @property
    def array_len(self) -> int | None:
        """Length of a char[N] string field (bytes in Parquet), else None."""
        a = self._array
        return a[1] if a and a[0] == "char" else None

    @property
    def element(self) -> str:
        """The C type key of one element (the field itself when scalar)."""
        a = self._array
        return a[0] if a else self.ctype

    @property
    def count(self) -> int:
        a = self._array
        return a[1] if a else 1

    @property
    def size(self) -> int:
        if self.element == "char":
            return self.count
        return np.dtype(CTYPES[self.element][0]).itemsize * self.count

    @property
    def align(self) -> int:
        return 1 if self.element == "char" else np.dtype(CTYPES[self.element][0]).itemsize

    def c_decl(self) -> str:
        if self.element == "char":
            return f"char {self.name}[{self.count}];"
        dims = f"[{self.count}]" if self._array else ""
        return f"{CTYPES[self.element][1]} {self.name}{dims};"

    def np_type(self):
        if self.element == "char":
            return f"S{self.count}"
        base = CTYPES[self.element][0]
        return (base, (self.count,)) if self._array else base


@dataclass(frozen=True)
class Record:
    """A fixed-layout C struct.  Fields must be declared naturally aligned
    and the total size must be a multiple of 8, so that the C compiler, numpy
    and the BPF verifier all agree without padding rules."""

    name: str
    fields: tuple[Field, ...]
    doc: str = ""

    def __post_init__(self) -> None:
        off = 0
        for f in self.fields:
            if off % f.align:
                raise ValueError(f"{self.name}.{f.name} at {off} is not {f.align}-aligned")
            off += f.size
        if off % 8:
            raise ValueError(f"{self.name} size {off} is not a multiple of 8")

    @property
    def size(self) -> int:
        return sum(f.size for f in self.fields)

    def offsets(self) -> dict[str, int]:
        out, off = {}, 0
        for f in self.fields:
            out[f.name] = off
            off += f.size
        return out

    @property
    def dtype(self) -> np.dtype:
        return np.dtype([(f.name, f.np_type()) for f in self.fields])

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    def c_struct(self, prefix: str = "") -> str:
        lines = [f"/* {self.doc} */"] if self.doc else []
        lines.append(f"struct {prefix}{self.name} {{")
        for f in self.fields:
            unit = f" /* {f.unit} */" if f.unit else ""
            lines.append(f"    {f.c_decl()}{unit}")
        lines.append("};")
        return "\n".join(lines)


def fields(spec: Iterable[tuple]) -> tuple[Field, ...]:
    return tuple(Field(*s) for s in spec)
