"""The package's floors: conjugate/ never imports lab/, and kernels/ imports nothing else of conjugate
but itself."""
from __future__ import annotations

import ast
from pathlib import Path

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
