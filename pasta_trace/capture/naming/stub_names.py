"""Match a host function's ELF symbol to the kernel of the fatbin it launches.

nvcc names a kernel's host stub after the kernel, but not always with the
kernel's own mangled name:

- a kernel with internal linkage (`static`, or any template instance nvcc
  gives internal linkage, as it does for templates in a namespace) has its
  stub mangled with the `L` marker before the entity's <source-name>
  (`_ZN2nsL5scaleIfEEvPT_S1_i`, `_ZL12local_kernelPi`: a GCC extension of the
  Itanium ABI's <unqualified-name>), while the fatbin, where linkage means
  nothing, names it without (`_ZN2ns5scaleIfEEvPT_S1_i`);
- a kernel over an extended lambda (`--extended-lambda`) has a stub over
  nvcc's host-side wrapper type (`_Z4eachI17__nv_dl_wrapper_t...`), while the
  fatbin names the lambda's own closure type (`_Z4eachIZ4mainEUliE_EvT_i`):
  the names share only the template's name, which names the kernel when
  exactly one kernel of that template is in the file's fatbin;
- nvcc's device stub function `__device_stub__<mangled kernel>` holds the
  kernel's mangled name without its leading `_` as a length-prefixed
  identifier (an extern "C" kernel's is mangled anyway, `Z14plain_c_kernelPi`).
"""

from __future__ import annotations

import re

_DEVICE_STUB = re.compile(r"(\d+)__device_stub__")
_CV = re.compile(r"[rVK]*[RO]?")


def _source_name(s: str, i: int) -> int | None:
    """The end of the <source-name> (`<length><identifier>`) at ``s[i]``, or None."""
    m = re.compile(r"\d+").match(s, i)
    if m is None or int(m.group()) == 0:
        return None
    end = m.end() + int(m.group())
    return end if end <= len(s) else None


def external_name(symbol: str) -> str:
    """``symbol`` with the internal-linkage `L` markers of its leading name
    taken out: `_ZN2nsL5scaleIfEEvPT_S1_i` -> `_ZN2ns5scaleIfEEvPT_S1_i`,
    `_ZL5helloPi` -> `_Z5helloPi`.  Only the <unscoped-name> after `_Z`, or
    the components of the <nested-name> after `_ZN` up to the first template
    arguments, are read: an `L` further on is a literal (`Li4E`)."""
    if not symbol.startswith("_Z"):
        return symbol
    i = 2
    if symbol.startswith("L", i) and _source_name(symbol, i + 1):
        return symbol[:i] + symbol[i + 1:]
    if not symbol.startswith("N", i):
        return symbol
    i = _CV.match(symbol, i + 1).end()
    out = symbol[:i]
    while i < len(symbol):
        if symbol[i] == "L" and (end := _source_name(symbol, i + 1)):
            out += symbol[i + 1:end]
        elif end := _source_name(symbol, i):
            out += symbol[i:end]
        else:
            return out + symbol[i:]
        i = end
    return out


def _template_prefix(symbol: str) -> str | None:
    """The mangled name up to its first template arguments (`_Z4eachI`,
    `_ZN2ns5scaleI`), linkage markers taken out; None for a name with none."""
    name = external_name(symbol)
    if not name.startswith("_Z"):
        return None
    i = 2 + name.startswith("N", 2)
    while (end := _source_name(name, i)) is not None:
        i = end
    return name[: i + 1] if name.startswith("I", i) and i > 3 else None


def kernel_of_symbol(symbol: str | None, kernels: frozenset[str]) -> str | None:
    """The fatbin kernel a host function symbol launches (module text), or None."""
    if symbol is None:
        return None
    for cand in (symbol, external_name(symbol)):
        if cand in kernels:
            return cand
    m = _DEVICE_STUB.search(symbol)
    if m is not None:
        ident = symbol[m.end(): m.end() + int(m.group(1)) - len("__device_stub__")]
        plain = re.match(r"Z(\d+)", ident)
        for cand in ("_" + ident, ident[plain.end(): plain.end() + int(plain.group(1))] if plain else None):
            if cand in kernels:
                return cand
        return None
    prefix = _template_prefix(symbol)
    if prefix is None or "__nv_dl_wrapper_t" not in symbol and "__nv_hdl_wrapper_t" not in symbol:
        return None
    same = [k for k in kernels if _template_prefix(k) == prefix]
    return same[0] if len(same) == 1 else None
