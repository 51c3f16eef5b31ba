"""The mesh is a lower layer: it imports nothing from the runtime, the router/routing, inference or
the APIs (what it serves is declared by the root), and its modules import without cycles."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import hydra_node.mesh

MESH_DIR = Path(hydra_node.mesh.__file__).parent
FORBIDDEN = ("hydra_node.runtime", "hydra_node.router", "hydra_node.routing", "hydra_node.inference",
             "hydra_node.api", "hydra_node.discovery", "hydra_node.node", "hydra_node.metrics")


def imports_of(path: Path) -> set[str]:
    """Absolute names of the modules ``path`` imports (relative imports resolved within the mesh)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = "hydra_node.mesh" + (f".{base}" if base else "")
                out.update(f"{base}.{alias.name}" for alias in node.names)  # `from . import x`
            out.add(base)
    return out


MODULES = sorted(p for p in MESH_DIR.glob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_mesh_imports_only_downward(path: Path):
    bad = sorted(name for name in imports_of(path) if name.startswith(FORBIDDEN))
    assert not bad, f"{path.name} imports {bad}"


def test_mesh_modules_have_no_import_cycles():
    names = {p.stem for p in MODULES}
    graph = {p.stem: {n.rsplit(".", 1)[-1] for n in imports_of(p) if n.startswith("hydra_node.mesh.")} & names
             for p in MODULES}
    for name in graph:
        graph[name].discard(name)
    visiting: list[str] = []
    done: set[str] = set()

    def visit(node: str) -> None:
        if node in done:
            return
        assert node not in visiting, "import cycle: " + " -> ".join(visiting[visiting.index(node):] + [node])
        visiting.append(node)
        for dep in sorted(graph[node]):
            visit(dep)
        visiting.pop()
        done.add(node)

    for name in sorted(graph):
        visit(name)
