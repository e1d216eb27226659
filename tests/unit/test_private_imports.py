"""No module of pasta_trace imports another module's private name: what two
modules share is public in one of them (or moves to a module of its own), so
that a leading underscore keeps meaning "only this file uses it"."""

from __future__ import annotations

import ast
from pathlib import Path

import pasta_trace

PACKAGE = Path(pasta_trace.__file__).parent


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(package: Path) -> list[str]:
    """`file:line: statement` for each import, in `package`'s modules, of a
    private name or module of `package` itself (third-party imports are not
    this package's to mend)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(package.parent)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                ours = node.level > 0 or (node.module or "").split(".")[0] == package.name
                if not ours:
                    continue
                source = "." * node.level + (node.module or "")
                if any(_private(part) for part in (node.module or "").split(".")):
                    found.append(f"{where}:{node.lineno}: from {source} import ...")
                found += [f"{where}:{node.lineno}: from {source} import {a.name}" for a in node.names
                          if _private(a.name)]
            elif isinstance(node, ast.Import):
                found += [f"{where}:{node.lineno}: import {a.name}" for a in node.names
                          if a.name.split(".")[0] == package.name and any(map(_private, a.name.split(".")))]
    return found


def test_no_module_imports_a_private_name_of_another() -> None:
    assert private_imports(PACKAGE) == []


def test_the_check_finds_each_kind_of_private_import(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "_hidden.py").write_text("")
    (pkg / "a.py").write_text("_x = 1\ny = 2\n__all__ = ['y']\n")
    (pkg / "sub" / "b.py").write_text(
        "from __future__ import annotations\n"  # a dunder: not private
        "from ..a import _x, y\n"
        "from .. import a\n"
        "from pkg.a import _x as x\n"
        "from . import _hidden\n"
        "from ._hidden import thing\n"
        "import pkg.sub._hidden\n"
        "from os import _exit\n"  # another package's: not this check's
        "from .__init__ import y\n"
    )
    assert private_imports(pkg) == [
        "pkg/sub/b.py:2: from ..a import _x",
        "pkg/sub/b.py:4: from pkg.a import _x",
        "pkg/sub/b.py:5: from . import _hidden",
        "pkg/sub/b.py:6: from ._hidden import ...",
        "pkg/sub/b.py:7: import pkg.sub._hidden",
    ]
