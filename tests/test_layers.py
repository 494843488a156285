"""The package's floors: conjugate/ never imports lab/, kernels/ imports nothing else of conjugate but
itself, no module imports another that imports it back (function-level imports included), and every
import between rooms points down the floors below."""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parents[1] / "conjugate"


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_nothing_in_the_package_imports_the_lab():
    offenders = {str(p.relative_to(PACKAGE)): sorted(n for n in _imports(p) if n.split(".")[0] == "lab")
                 for p in PACKAGE.rglob("*.py")}
    assert not {p: names for p, names in offenders.items() if names}


def test_the_kernels_import_only_triton_and_each_other():
    for path in (PACKAGE / "kernels").glob("*.py"):
        outside = {n for n in _imports(path) if n.startswith("conjugate") and not n.startswith("conjugate.kernels")}
        assert not outside, (path.name, outside)


# Each room's floor: a room imports only rooms on lower floors (cli on top, the ground rooms at 0).
FLOORS = {"errors": 0, "roles": 0, "text": 0, "kernels": 0, "files": 1, "secrets": 1, "paths": 1,
          "conjugate": 2, "models": 2, "workload": 3, "graph": 4, "plan": 5, "compiler": 6, "evaluate": 7,
          "agents": 8, "search": 9, "serving": 9, "cli": 10, "__main__": 11}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> nx.DiGraph:
    """Module -> the package's modules it imports anywhere in its body, except under TYPE_CHECKING."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                       and "TYPE_CHECKING" in ast.unparse(block.test) for n in ast.walk(block)}
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(tree):
            if id(node) in typing_only or not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in modules and target != name:
                    graph.add_edge(name, target)
    return graph


def _room(module: str) -> str:
    return module.split(".")[1] if "." in module else module


def test_no_import_cycles_even_through_function_level_imports():
    graph = _import_graph()
    assert graph.number_of_edges() > 100  # the walk found the package's imports
    assert list(nx.simple_cycles(graph)) == []


def test_every_import_between_rooms_points_down():
    graph = _import_graph()
    assert {_room(m) for m in graph} <= set(FLOORS), {_room(m) for m in graph} - set(FLOORS)
    upward = sorted((a, b) for a, b in graph.edges() if _room(a) != _room(b) and FLOORS[_room(a)] <= FLOORS[_room(b)])
    assert upward == []
