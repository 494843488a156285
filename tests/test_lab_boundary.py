"""The package never imports lab/: what was tried stays out of what ships."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "conjugate"


def _imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_no_module_of_the_package_imports_lab():
    offenders = {str(path.relative_to(PACKAGE.parent)): sorted(m for m in _imported_modules(path)
                                                               if m == "lab" or m.startswith("lab."))
                 for path in sorted(PACKAGE.rglob("*.py"))}
    assert {path: mods for path, mods in offenders.items() if mods} == {}
    assert len(offenders) > 10  # the walk found the package
