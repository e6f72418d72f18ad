"""The package's imports point one way: no circle, and each layer imports only the layers below it.

Read from the source with ``ast``, not by importing. Every import that runs counts — at the top of a
module or inside a function: an import moved into a function to get past a circle only hides the
circle, and the modules still cannot be read or loaded one without the other. Imports under
``if TYPE_CHECKING:`` never run and do not count. A module's own parent packages are being imported
already when it runs, so importing one of them is no edge — unless a name other than a submodule is
taken from it (``from teibatch.fleet import Provider`` depends on ``fleet/__init__.py`` being done).
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"

# The layers, lowest first: a module imports modules of its own group and of groups on lower layers;
# two groups on one layer know nothing of each other. A group is a subpackage or a top-level module;
# `cli.py`, `cli_*.py`, `entry.py` and `__main__.py` are the group "cli". (README: cli → pipeline →
# corpus, tei, sink, fleet.) A new top-level module or subpackage gets its line here.
LAYERS: list[set[str]] = [
    {"teibatch", "errors"},  # the version and the error types
    {"endpoint", "lazy", "sparse", "quantize", "storage_errors", "crashpoints", "token_cuts", "svgdraw", "logs",
     "native_stderr", "jobfile"},  # shared leaves
    {"server"},  # the built-in TEI server: stands alone (the corpus counts tokens by its rule)
    {"corpus", "tei", "sink", "fleet"},
    {"job"},  # the job spec names the corpus's and the sink's options
    {"pipeline"},
    {"bench", "htmlreport"},  # what `teibatch bench` and `teibatch report` run
    {"cli"},
]

# Third-party packages a group must not import (DESIGN: tei knows nothing of Ray, fleet nothing of Parquet).
FOREIGN: dict[str, set[str]] = {
    "tei": {"ray", "pyarrow"},
    "fleet": {"pyarrow"},
}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int


def modules(root: Path, package: str) -> dict[str, Path]:
    """Every module of ``package`` under ``root`` by dotted name (a package by its own name)."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_that_run(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement in ``tree``, at any depth, except those under ``if TYPE_CHECKING:``."""
    if isinstance(tree, ast.If) and _type_checking(tree):
        for node in tree.orelse:
            yield from imports_that_run(node)
        return
    if isinstance(tree, ast.Import | ast.ImportFrom):
        yield tree
    for child in ast.iter_child_nodes(tree):
        yield from imports_that_run(child)


def _targets(name: str, is_package: bool, node: ast.Import | ast.ImportFrom,
             known: Collection[str]) -> Iterator[tuple[str, bool]]:
    """The modules of ``known`` that ``node`` runs, each with whether it takes a name defined in it.

    ``import a.b.c`` runs ``a``, ``a.b`` and ``a.b.c``; ``from a.b import c`` runs ``a``, ``a.b`` and,
    when ``c`` is a submodule, ``a.b.c`` — else ``c`` is a name that ``a.b`` must have defined.
    """
    if isinstance(node, ast.Import):
        dotted = [alias.name for alias in node.names]
        named: list[str] = []
    else:
        base = node.module or ""
        if node.level:
            package = name if is_package else name.rpartition(".")[0]
            parts = package.split(".")
            anchor = ".".join(parts[:len(parts) - (node.level - 1)])
            base = f"{anchor}.{base}" if node.module else anchor
        dotted = [base] + [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known]
        named = [base] if any(f"{base}.{alias.name}" not in known for alias in node.names) else []
    for each in dotted:
        parts = each.split(".")
        for depth in range(1, len(parts) + 1):
            if (prefix := ".".join(parts[:depth])) in known:
                yield prefix, False
    for each in named:
        if each in known:
            yield each, True


def import_edges(root: Path, package: str) -> list[Edge]:
    """Which module of ``package`` imports which other, from the source under ``root``."""
    found = modules(root, package)
    edges: dict[tuple[str, str], Edge] = {}
    for name, path in found.items():
        ancestors = {".".join(name.split(".")[:k]) for k in range(1, name.count(".") + 1)}
        is_package = path.name == "__init__.py"
        for node in imports_that_run(ast.parse(path.read_text(), str(path))):
            for target, takes_names in _targets(name, is_package, node, found):
                if target == name or (target in ancestors and not takes_names):
                    continue
                edges.setdefault((name, target), Edge(name, target, node.lineno))
    return sorted(edges.values(), key=lambda edge: (edge.source, edge.target))


def circles(edges: list[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative), each sorted."""
    graph: dict[str, list[str]] = {}
    for edge in edges:
        graph.setdefault(edge.source, []).append(edge.target)
        graph.setdefault(edge.target, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(graph[target])))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def group(module: str) -> str:
    """The layer table's name for ``module``: its subpackage or top-level module under ``teibatch``."""
    parts = module.split(".")
    if len(parts) == 1:
        return parts[0]
    top = parts[1]
    return "cli" if top in ("cli", "entry", "__main__") or top.startswith("cli_") else top


def layer(name: str) -> int:
    for rank, names in enumerate(LAYERS):
        if name in names:
            return rank
    raise AssertionError(f"{name} is in no layer: give it its line in LAYERS in {Path(__file__).name}")


def _describe(circle: list[str], edges: list[Edge]) -> str:
    members = set(circle)
    inside = [f"  {e.source} imports {e.target} (line {e.line})" for e in edges
              if e.source in members and e.target in members]
    return "circle of " + ", ".join(circle) + ":\n" + "\n".join(inside)


def test_no_import_circle() -> None:
    edges = import_edges(SRC, "teibatch")
    found = circles(edges)
    assert not found, "\n".join(_describe(circle, edges) for circle in found)


def test_imports_point_down_the_layers() -> None:
    wrong = []
    for edge in import_edges(SRC, "teibatch"):
        source, target = group(edge.source), group(edge.target)
        if source != target and layer(source) <= layer(target):
            wrong.append(f"{edge.source} imports {edge.target} (line {edge.line}): "
                         f"{source} may import only groups below it in LAYERS, not {target}")
    assert not wrong, "\n".join(wrong)


def test_foreign_imports_stay_in_their_layers() -> None:
    wrong = []
    for name, path in modules(SRC, "teibatch").items():
        banned = FOREIGN.get(group(name), set())
        for node in imports_that_run(ast.parse(path.read_text(), str(path))):
            roots = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if not node.level else [])
            wrong += [f"{name} imports {root} (line {node.lineno})" for root in roots
                      if root.partition(".")[0] in banned]
    assert not wrong, "\n".join(wrong)


def test_nothing_below_the_pipeline_reads_the_job() -> None:
    # The driver turns the job into each package's own options: below it, not even a type names the job.
    wrong = []
    for name, path in modules(SRC, "teibatch").items():
        if layer(group(name)) >= layer("job"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                       else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            wrong += [f"{name} imports {target} (line {node.lineno})" for target in targets
                      if target == "teibatch.job" or target.startswith("teibatch.job.")]
    assert not wrong, "\n".join(wrong)


def test_every_group_has_a_layer() -> None:
    for name in modules(SRC, "teibatch"):
        layer(group(name))


def _write(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize(("files", "expected"), [
    pytest.param({"a.py": "import pkg.b\n", "b.py": "def f():\n    from pkg import a\n"},
                 [["pkg.a", "pkg.b"]], id="inside-a-function"),
    pytest.param({"a.py": "from pkg.b import x\n",
                  "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import y\n"},
                 [], id="type-checking-only"),
    pytest.param({"__init__.py": "from pkg.sub.a import x\n", "sub/__init__.py": "",
                  "sub/a.py": "from pkg.sub import b\n", "sub/b.py": "from . import c\n", "sub/c.py": ""},
                 [], id="package-reexports-its-modules"),
    pytest.param({"__init__.py": "from pkg.a import x\n", "a.py": "from pkg import y\n"},
                 [["pkg", "pkg.a"]], id="name-from-own-package"),
    pytest.param({"a.py": "from .b import x\n", "b.py": "from .c import y\n", "c.py": "from . import a\n"},
                 [["pkg.a", "pkg.b", "pkg.c"]], id="relative-three"),
])
def test_walker_finds_circles(tmp_path: Path, files: dict[str, str], expected: list[list[str]]) -> None:
    _write(tmp_path / "pkg", {"__init__.py": "", **files})
    assert circles(import_edges(tmp_path, "pkg")) == expected
