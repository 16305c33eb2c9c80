"""The house's import graph: secfed's module-level imports form no cycle.

A cycle means a module cannot be imported on its own (it needs its importer to be half-loaded
first), and that importing one small part (say `secfed.privacy.clipping`) drags in the rest of
the house.  The graph is read from the source with `ast`, so the test sees every module-level
import, including the ones a lucky import order would hide; imports inside functions are
deliberate late bindings and are not edges.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The four folders that make one import package (pyproject.toml's package-dir).
FOLDERS = {"secfed": ROOT / "secfed", "secfed.protocols": ROOT / "protocols",
           "secfed.attacks": ROOT / "attacks", "secfed.cli": ROOT / "cli"}


def _modules() -> dict[str, Path]:
    """Every module of the import package, by dotted name."""
    found: dict[str, Path] = {}
    for package, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def _absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute name an `from X import ...` refers to."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The secfed modules that `module` imports at module level (not inside functions)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    edges: set[str] = set()
    for node in tree.body:
        stmts = [node]
        if isinstance(node, (ast.If, ast.Try)):  # `if TYPE_CHECKING:` is not a runtime import
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            stmts = list(ast.walk(node))
        for stmt in stmts:
            names: list[str] = []
            if isinstance(stmt, ast.Import):
                names = [alias.name for alias in stmt.names]
            elif isinstance(stmt, ast.ImportFrom):
                base = _absolute(module, path, stmt)
                names = [base] + [f"{base}.{alias.name}" for alias in stmt.names]
            edges |= {name for name in names if name in known and name != module}
    return edges


def import_graph() -> dict[str, set[str]]:
    """Module -> the secfed modules it imports at module level.

    Importing `a.b.c` also runs `a/__init__` and `a/b/__init__`, so those are edges too."""
    known = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        edges = set()
        for target in _targets(module, path, known):
            parts = target.split(".")
            edges |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
        graph[module] = {e for e in edges if e in known and e != module
                         and not module.startswith(e + ".")}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a list of modules, or None (iterative DFS, three colours)."""
    colour: dict[str, int] = {}
    for start in sorted(graph):
        if colour.get(start):
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        colour[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                colour[node] = 2
                stack.pop()
                path.pop()
            elif colour.get(child) == 1:
                return path[path.index(child):] + [child]
            elif not colour.get(child):
                colour[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(graph[child]))))
    return None


def test_find_cycle_finds_a_planted_cycle() -> None:
    """The checker itself: a three-module cycle is found, a diamond is not a cycle."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}) is None


def test_the_graph_sees_the_core_modules() -> None:
    """The walk is not vacuous: it finds the config and the methods, and their edges."""
    graph = import_graph()
    assert "secfed.config" in graph and "secfed.algorithms.base" in graph
    assert "secfed.protocols.secagg" in graph
    assert sum(len(edges) for edges in graph.values()) > 100


def test_secfed_module_level_imports_have_no_cycle() -> None:
    """No chain of module-level imports in secfed leads back to where it started."""
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def _every_import(module: str) -> set[str]:
    """The secfed modules ``module`` imports anywhere: at module level, in functions, under TYPE_CHECKING."""
    known = _modules()
    path = known[module]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, path, node)
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return {name for name in found if name in known}


def test_the_schema_and_its_errors_sit_below_the_rules() -> None:
    """The schema (`secfed.config`) and its errors (`secfed.errors`) import no method and no privacy rule,
    not even inside a function: the rules import the schema, and `secfed.validation` combines them.
    (A late import hides a cycle from the module-level graph but still ties the layers together.)"""
    for module in ("secfed.config", "secfed.errors"):
        above = {name for name in _every_import(module)
                 if name.startswith(("secfed.algorithms", "secfed.privacy", "secfed.validation"))}
        assert not above, f"{module} imports {sorted(above)}"
