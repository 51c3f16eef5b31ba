"""Which mesh model answers a model id the mesh does not have (pure).

Clients of Anthropic's API (Claude Code, the ``anthropic`` SDK) ask for ``claude-*`` models; the
node maps those to the largest model of the mesh, and so does ``hydra claude|opencode|pi|goose``
when no ``--model`` is given. "Largest": by file size where it is known, else by the parameter
count written in the id (``135M``, ``1.5B``, ``7b``, ``8x7B``), then by id, so the choice is
deterministic. docs/agents.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

__all__ = ["CLAUDE_PREFIX", "largest_model", "parameter_count", "resolve_model"]

#: Model ids with this prefix are Anthropic's: mapped to the largest mesh model.
CLAUDE_PREFIX = "claude"
_PARAMS = re.compile(r"(?<![A-Za-z0-9.])(?:(\d+)x)?(\d+(?:\.\d+)?)([MmBbTt])(?![A-Za-z])")
_SCALE = {"m": 1e6, "b": 1e9, "t": 1e12}


def parameter_count(model_id: str) -> float:
    """The parameter count written in ``model_id`` (the largest figure in it), or 0 when none is."""
    best = 0.0
    for experts, size, unit in _PARAMS.findall(model_id):
        best = max(best, float(size) * _SCALE[unit.lower()] * (int(experts) if experts else 1))
    return best


def largest_model(ids: Iterable[str], sizes: Mapping[str, int] | None = None) -> str | None:
    """The largest of ``ids`` (see the module doc); None when there is none."""
    sizes = sizes or {}
    pool = sorted(set(ids))
    if not pool:
        return None
    return max(pool, key=lambda m: (sizes.get(m) or 0, parameter_count(m), m))


def resolve_model(requested: str, ids: Iterable[str], mapped: str | None = None) -> str:
    """The mesh model that serves ``requested``: itself when the mesh has it; for ``claude-*``
    names ``mapped`` (configured) or the largest model; anything else unchanged (a 404 follows)."""
    pool = list(ids)
    if requested in pool or not requested.startswith(CLAUDE_PREFIX):
        return requested
    if mapped:
        return mapped
    return largest_model(pool) or requested
