"""Imports run downward only: a test that fails on an upward import (see docs/architecture.md).

Checked by reading every module's imports (``ast``, nothing is imported): ``runtime/`` never imports
``api/``, the router, routing or the node; ``routing/`` and the router never import ``api/``
(``/metrics`` included) or the node; ``api/`` never imports the node; and no service module
imports ``hydra_node.node`` (only the command line does, to start one).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import hydra_node

ROOT = Path(hydra_node.__file__).parent

#: package (or module) prefix → the prefixes it must never import.
FORBIDDEN = {
    "hydra_node.runtime": ("hydra_node.api", "hydra_node.router", "hydra_node.routing", "hydra_node.node"),
    "hydra_node.routing": ("hydra_node.api", "hydra_node.metrics", "hydra_node.node"),
    "hydra_node.router": ("hydra_node.api", "hydra_node.routing", "hydra_node.node"),
    "hydra_node.api": ("hydra_node.node", "hydra_node.cli"),
    "hydra_node.mesh": ("hydra_node.node",),
    "hydra_node.discovery": ("hydra_node.node",),
}
#: Command-line pieces that live next to the service they configure (they talk to a node over HTTP).
CLI_MODULES = {"hydra_node.runtime.hosting_cli"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, module: str) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.add(name)
            out.update(f"{name}.{alias.name}" for alias in node.names)
    return out


def _violations(module: str, imported: set[str]) -> list[str]:
    bad = []
    for owner, forbidden in FORBIDDEN.items():
        if module != owner and not module.startswith(owner + "."):
            continue
        for name in sorted(imported):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                bad.append(f"{module} imports {name}")
    return bad


MODULES = sorted((p, _module_name(p)) for p in ROOT.rglob("*.py"))


@pytest.mark.parametrize("path,module", MODULES, ids=[m for _, m in MODULES])
def test_no_upward_import(path, module):
    if module in CLI_MODULES:
        return
    assert _violations(module, _imports(path, module)) == []


def test_the_checker_sees_an_upward_import():
    assert _violations("hydra_node.runtime.hosting", {"hydra_node.api.http"}) == [
        "hydra_node.runtime.hosting imports hydra_node.api.http"]
    assert _violations("hydra_node.routing.live", {"hydra_node.inference"}) == []
    assert _violations("hydra_node.router", {"hydra_node.routing.live.LiveScheduling"})
