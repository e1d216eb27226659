"""The display form of a kernel's mangled name: demangled, without the
return type and the parameter list (`_ZN2ns5scaleIfEEvPT_S1_i` ->
`ns::scale<float>`, an anonymous namespace -> `(anonymous namespace)::k`).

Names are stored mangled, as the fatbin holds them (docs/formats.md); the
display form is made where names are shown.  Demangled by binutils' c++filt,
all names of one call in one run of it (one process start, ~2 ms, for
thousands of names); without c++filt, or for a name it leaves alone (an
`extern "C"` kernel, `unknown@0x...`), the name is shown as it is."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable

_OPEN, _CLOSE = "<({[", ">)}]"
TIMEOUT_S = 30


def short_form(demangled: str) -> str:
    """``demangled`` without its trailing parameter list and leading return type."""
    s = demangled.strip()
    if s.endswith(")"):  # the parameter list: from its matching "("
        depth = 0
        for i in range(len(s) - 1, -1, -1):
            depth += (s[i] in _CLOSE) - (s[i] in _OPEN)
            if depth == 0:
                s = s[:i]
                break
    depth, cut = 0, 0
    for i, c in enumerate(s):  # the return type ends at the last space outside brackets
        depth += (c in _OPEN) - (c in _CLOSE)
        if c == " " and depth == 0 and not s[i - 1] == ",":
            cut = i + 1
    return s[cut:] or demangled


def display_names(names: Iterable[str]) -> dict[str, str]:
    """mangled -> display form, for each distinct name."""
    distinct = [n for n in dict.fromkeys(names) if n is not None]
    mangled = [n for n in distinct if n.startswith("_Z") and "\n" not in n]
    out = {n: n for n in distinct}
    tool = shutil.which("c++filt")
    if not mangled or tool is None:
        return out
    try:
        r = subprocess.run([tool], input="\n".join(mangled) + "\n", capture_output=True, text=True,
                           timeout=TIMEOUT_S, check=True)
    except (OSError, subprocess.SubprocessError):
        return out
    lines = r.stdout.split("\n")
    if len(lines) < len(mangled):
        return out
    for n, d in zip(mangled, lines):
        out[n] = short_form(d) if d != n else n
    return out
