"""No import circle anywhere in `proxy/`: between two modules, through a package's `__init__`, or
hidden behind `TYPE_CHECKING` or an import inside a function.

The layers themselves (which floor may import which) are import-linter's contracts in
pyproject.toml; its `acyclic_siblings` contract finds circles between the siblings of a package
but not one that runs through a package's own `__init__`. This test reads every import
statement of every module with `ast` and finds the circles (Tarjan's strongly connected
components), naming their modules. `make lint` runs it with lint-imports.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "proxy"


def module_names(package: Path) -> dict[str, Path]:
    """Dotted name → file of every module of `package` (a package is its `__init__.py`)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, modules: Iterable[str]) -> set[str]:
    """The modules of `modules` that module `name` imports, wherever the import statement is
    (module level, `if TYPE_CHECKING:`, a function body)."""
    known = set(modules)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            # `from package import module` imports that module; `from module import name`
            # the module.
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        for target in targets:
            resolved = resolve(target)
            if resolved is not None and resolved != name:
                found.add(resolved)
    return found


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    modules = module_names(package)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def circles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or around a circle (Tarjan's
    strongly connected components of more than one module), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        # Iterative, so that a deep chain of imports cannot hit Python's recursion limit.
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_around_a_circle() -> None:
    graph = import_graph()
    assert len(graph) > 100  # the whole package was read
    problems = circles(graph)
    assert not problems, "import circles (move the shared piece down a floor): " + "; ".join(
        " <-> ".join(group) for group in problems
    )


def test_circles_are_found_and_named() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e", "d"}, "f": {"g"}}
    assert circles(graph) == [["a", "b", "c"]]


def test_every_kind_of_import_statement_counts(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from pkg.sub import low\n")
    (package / "sub" / "low.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from pkg.high import Thing\n"
        "def late():\n"
        "    from .. import other\n"
        "    import pkg.sub\n"
    )
    (package / "high.py").write_text("import os\nfrom .sub.low import late\n")
    (package / "other.py").write_text("from pkg import high\n")
    graph = import_graph(package)
    assert graph["pkg.sub.low"] == {"pkg.high", "pkg.other", "pkg.sub"}
    assert graph["pkg.high"] == {"pkg.sub.low"}
    assert graph["pkg.sub"] == {"pkg.sub.low"}
    assert graph["pkg.other"] == {"pkg.high"}
    # Through a TYPE_CHECKING import, a function's imports and a package's own __init__.
    assert circles(graph) == [["pkg.high", "pkg.other", "pkg.sub", "pkg.sub.low"]]
