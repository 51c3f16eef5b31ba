"""Typed status objects → the JSON the management API serves (``/api/status`` and friends).

Services return frozen dataclasses (``statistics()`` / ``status()``); the API renders them here,
once: a dataclass becomes an object of its fields in declaration order (a field whose metadata
has ``omit_none`` is left out while None), mappings and sequences are walked, enums become their
values, anything else is returned as is (``json.dumps(default=str)`` covers the rest).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

__all__ = ["to_json"]


def to_json(value: Any) -> Any:
    """``value`` as plain JSON data (see the module docstring)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if item is None and f.metadata.get("omit_none"):
                continue
            out[f.name] = to_json(item)
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    return value
