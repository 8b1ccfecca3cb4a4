"""The inputs wing imports one way: no module of ``clip_flash.inputs`` reaches itself again through imports, those
inside functions included (a lazy import only hides a circle until someone moves it)."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "clip_flash"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, root: Path) -> Set[str]:
    """Every module (and ``package.name``) this file imports, relative imports resolved."""
    name = _module_name(path, root)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def import_circles(root: Path, prefix: str) -> List[List[str]]:
    """The strongly connected groups of more than one module among the modules under ``prefix`` of the package
    at ``root``."""
    files = {_module_name(path, root): path for path in root.rglob("*.py")}
    inside = {name for name in files if name == prefix or name.startswith(prefix + ".")}
    graph: Dict[str, Set[str]] = {name: (_imports(files[name], root) & inside) - {name} for name in inside}
    order: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    circles: List[List[str]] = []

    def visit(name: str) -> None:  # Tarjan's algorithm
        order[name] = low[name] = len(order)
        stack.append(name)
        for other in graph[name]:
            if other not in order:
                visit(other)
                low[name] = min(low[name], low[other])
            elif other in stack:
                low[name] = min(low[name], order[other])
        if low[name] == order[name]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == name:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for name in sorted(graph):
        if name not in order:
            visit(name)
    return circles


def test_inputs_have_no_import_circle():
    assert import_circles(PACKAGE_ROOT, "clip_flash.inputs") == []


def test_the_check_finds_a_circle(tmp_path):
    package = tmp_path / "clip_flash" / "inputs"
    package.mkdir(parents=True)
    (tmp_path / "clip_flash" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from .b import thing\n")
    (package / "b.py").write_text("def thing():\n    from .a import other\n")
    assert import_circles(tmp_path / "clip_flash", "clip_flash.inputs") == [["clip_flash.inputs.a",
                                                                             "clip_flash.inputs.b"]]
