"""The import rules of docs/architecture.md, checked on the source: layers import only downward, no cycles.

Every ``import`` in ``hydra_node/`` counts, including those inside functions: a lazy import
hides a dependency from the reader, not from the design.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "hydra_node"

#: Layer of each top-level part of the package (by the name after ``hydra_node.``).
LAYER_OF = {
    "": "base", "backoff": "base", "pidfile": "base", "logging_setup": "base", "native": "base", "eventlog": "base",
    "codec": "codec",
    "inference": "vocabulary", "models": "vocabulary",
    "mesh": "mesh",
    "runtime": "runtime",
    "routing": "routing",
    "discovery": "discovery",
    "api": "api",
    "node": "root", "node_parts": "root", "config": "root", "config_sections": "root",
    "cli": "cli",
}

#: Which layers each layer may import (itself included). This is the table in docs/architecture.md.
ALLOWED = {
    "base": {"base"},
    "codec": {"codec"},
    "vocabulary": {"vocabulary", "codec", "base"},
    "mesh": {"mesh", "codec", "base"},
    "runtime": {"runtime", "mesh", "vocabulary", "codec", "base"},
    "routing": {"routing", "runtime", "mesh", "vocabulary", "codec", "base"},
    "discovery": {"discovery", "mesh", "vocabulary", "codec", "base"},
    "api": {"api", "routing", "runtime", "mesh", "vocabulary", "codec", "base"},
    "root": {"root", "api", "discovery", "routing", "runtime", "mesh", "vocabulary", "codec", "base"},
    "cli": {"cli", "root", "api", "discovery", "routing", "runtime", "mesh", "vocabulary", "codec", "base"},
}

#: Longest module we accept; a file you cannot hold in your head is a file to split.
MAX_LINES = 450


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def layer(mod: str) -> str:
    parts = mod.split(".")
    return LAYER_OF.get(parts[1] if len(parts) > 1 else "", "unknown")


def imports_of(mod: str) -> set[str]:
    """Modules of hydra_node that ``mod`` imports (a ``from P import m`` of a submodule counts as P.m)."""
    path = MODULES[mod]
    tree = ast.parse(path.read_text(), str(path))
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("hydra_node"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("hydra_node"):
                continue
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES]
            out.update(subs)
            if len(subs) < len(node.names):
                out.add(target)
    # importing your own package's __init__ (its public surface) is no dependency of note
    return {t for t in out if t in MODULES and not mod.startswith(t + ".") and t != mod}


GRAPH = {m: imports_of(m) for m in MODULES}


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_imports_point_down(mod: str) -> None:
    src = layer(mod)
    assert src != "unknown", f"{mod}: add its top-level name to LAYER_OF (and docs/architecture.md)"
    bad = sorted(t for t in GRAPH[mod] if layer(t) not in ALLOWED[src])
    assert not bad, f"{mod} (layer {src}) imports upward or sideways: {bad}"


def test_no_import_cycles() -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def strongconnect(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            strongconnect(v)
    assert not cycles, f"import cycles: {cycles}"


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_module_size(mod: str) -> None:
    lines = MODULES[mod].read_text().count("\n")
    assert lines <= MAX_LINES, f"{mod} has {lines} lines (> {MAX_LINES}): split it"


def test_rule_checker_catches_an_upward_import(tmp_path) -> None:
    """The checker itself: a runtime module importing api is found."""
    assert "api" not in ALLOWED["runtime"] and "runtime" not in ALLOWED["mesh"]
    assert "inference" not in {layer(t) for t in GRAPH.get("hydra_node.mesh.service", ())}
