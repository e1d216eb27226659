"""No two modules of pasta_trace import each other, directly or round a
longer circle, counting the imports made inside functions too: a lazy import
hides a circle from the interpreter, not from the reader."""

from __future__ import annotations

import ast
from pathlib import Path

import pasta_trace

PACKAGE = Path(pasta_trace.__file__).parent

#: circles left as they are, each sorted; an entry goes when its circle is broken
KNOWN: list[list[str]] = []


def _name(package: Path, path: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(package: Path) -> dict[str, set[str]]:
    """Each module of `package` -> the modules of `package` it imports
    anywhere in its text (a package's __init__ counts as a module; a module's
    import of a package it lies in does not: that package is loaded first)."""
    files = {_name(package, p): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        here = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        graph[mod] = {m for m in found if m in files and m != mod and not mod.startswith(m + ".")}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out = []

    def visit(m: str) -> None:
        index[m] = low[m] = len(index)
        stack.append(m)
        for n in sorted(graph[m]):
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            group = []
            while not group or group[-1] != m:
                group.append(stack.pop())
            if len(group) > 1:
                out.append(sorted(group))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return sorted(out)


def test_no_import_circle() -> None:
    assert circles(imports(PACKAGE)) == KNOWN


def test_the_check_finds_a_lazy_circle(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "merge").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "schema.py").write_text("")
    (pkg / "merge" / "__init__.py").write_text("from .timeline import load\n")
    # the shape merge/timeline.py and merge/cluster.py had: one lazy import, one at the top
    (pkg / "merge" / "timeline.py").write_text(
        "from .. import schema\n\ndef load():\n    from .cluster import load_cluster\n")
    (pkg / "merge" / "cluster.py").write_text("from .timeline import MARKER\nfrom pkg import merge\n")
    assert imports(pkg) == {"pkg": set(), "pkg.schema": set(), "pkg.merge": {"pkg.merge.timeline"},
                            "pkg.merge.timeline": {"pkg.schema", "pkg.merge.cluster"},
                            "pkg.merge.cluster": {"pkg.merge.timeline"}}
    assert circles(imports(pkg)) == [["pkg.merge.cluster", "pkg.merge.timeline"]]
