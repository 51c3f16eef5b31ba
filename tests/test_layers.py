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
    "": "base",
    "backoff": "base",
    "pidfile": "base",
    "logging_setup": "base",
    "native": "base",
    "eventlog": "base",
    "statemachine": "base",
    "listen": "base",
    "codec": "codec",
    "inference": "vocabulary",
    "models": "vocabulary",
    "grammar": "vocabulary",
    "http": "http",
    "mesh": "mesh",
    "runtime": "runtime",
    "routing": "routing",
    "discovery": "discovery",
    "api": "api",
    "moa": "moa",
    "openai": "dialect",
    "responses": "dialect",
    "anthropic": "dialect",
    "admin": "admin",
    "node": "root",
    "config": "root",
    "cli": "cli",
}

_BELOW_API = {"routing", "runtime", "mesh", "http", "vocabulary", "codec", "base"}
#: Which layers each layer may import (itself included). This is the table in docs/architecture.md.
ALLOWED = {
    "base": {"base"},
    "codec": {"codec"},
    "vocabulary": {"vocabulary", "codec", "base"},
    "http": {"http", "base"},
    "mesh": {"mesh", "codec", "base"},
    "runtime": {"runtime", "mesh", "vocabulary", "codec", "base"},
    "routing": {"routing", "runtime", "mesh", "vocabulary", "codec", "base"},
    "discovery": {"discovery", "mesh", "vocabulary", "codec", "base"},
    "api": {"api"} | _BELOW_API,
    "moa": {"moa", "api"} | _BELOW_API,
    "dialect": {"dialect", "moa", "api"} | _BELOW_API,
    "admin": {"admin", "dialect", "moa", "api", "discovery"} | _BELOW_API,
    "root": {"root", "admin", "dialect", "moa", "api", "discovery"} | _BELOW_API,
    "cli": {"cli", "root", "admin", "dialect", "moa", "api", "discovery"} | _BELOW_API,
}

#: The child processes' code (model runner, batch engine, speculative engines, embeddings, KV jobs)
#: lives under ``runtime/child/``; the node side may import only the channel vocabulary from it.
CHILD = "hydra_node.runtime.child"
CHILD_VOCABULARY = {f"{CHILD}.channel", f"{CHILD}.stats"}  # the frames and the figures they carry

#: A module over this many lines is worth a look: one concept per module is the rule, and a
#: concept may be long (an HTTP connection, a state table); this bound only catches the outliers.
MAX_LINES = 800


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
    assert lines <= MAX_LINES, f"{mod} has {lines} lines (> {MAX_LINES}): does it hold more than one concept?"


def _top(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


@pytest.mark.parametrize("mod", sorted(m for m in MODULES if layer(m) == "dialect"))
def test_dialects_do_not_import_each_other(mod: str) -> None:
    """openai/, responses/ and anthropic/ share api/ (errors, chat events, fan-out, body checks) and moa/."""
    bad = sorted(t for t in GRAPH[mod] if layer(t) == "dialect" and _top(t) != _top(mod))
    assert not bad, f"{mod} imports another dialect: {bad} (move what both need into hydra_node/api/)"


@pytest.mark.parametrize("mod", sorted(m for m in MODULES if not (m == CHILD or m.startswith(CHILD + "."))))
def test_node_side_imports_only_the_channel_from_the_child(mod: str) -> None:
    """Code the node process runs never loads the child's modules (llama.cpp, numpy): only their channel."""
    bad = sorted(t for t in GRAPH[mod] if (t == CHILD or t.startswith(CHILD + ".")) and t not in CHILD_VOCABULARY)
    assert not bad, f"{mod} (node side) imports child-process code: {bad} (only {sorted(CHILD_VOCABULARY)})"


def _private_owner(mod: str) -> str | None:
    """The package owning ``mod`` when ``mod`` (or a package on its path) is private (``_name``)."""
    parts = mod.split(".")
    for k, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:k])
    return None


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_no_import_of_another_packages_private_module(mod: str) -> None:
    bad = []
    for t in GRAPH[mod]:
        owner = _private_owner(t)
        if owner is not None and not (mod == owner or mod.startswith(owner + ".")):
            bad.append(t)
    assert not bad, f"{mod} imports private modules of another package: {sorted(bad)} (make them public there)"


def test_rule_checker_catches_an_upward_import(tmp_path) -> None:
    """The checker itself: a runtime module importing api is found."""
    assert "api" not in ALLOWED["runtime"] and "runtime" not in ALLOWED["mesh"]
    assert _private_owner("hydra_node.routing._score") == "hydra_node.routing"
    assert _private_owner("hydra_node.routing.router") is None
    assert "inference" not in {layer(t) for t in GRAPH.get("hydra_node.mesh.service", ())}
