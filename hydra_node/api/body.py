"""A request body as a JSON object, and the field checks every dialect shares (pure).

Each refusal is an :class:`ApiError` 400 naming the fault (``invalid_json``, ``invalid_type``) and,
for a field, the field.
"""

from __future__ import annotations

import json
import math

from hydra_node.api.errors import bad

__all__ = ["MAX_JSON_DEPTH", "load_body", "number"]

#: Deepest JSON nesting accepted in a request body (objects and arrays).
MAX_JSON_DEPTH = 64


def _depth_ok(obj) -> bool:
    """True when ``obj`` nests at most MAX_JSON_DEPTH containers deep (iterative: no recursion)."""
    stack = [(obj, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            if d > MAX_JSON_DEPTH:
                return False
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return True


def load_body(raw: bytes) -> dict:
    """The JSON object in ``raw``; a 400 for anything else (bad JSON, too deep, not an object)."""
    too_deep = False
    try:
        body = json.loads(raw)
    except RecursionError:  # the C decoder's own bound, far above ours
        body, too_deep = None, True
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad(f"request body is not valid JSON: {exc}", None, "invalid_json") from None
    if too_deep or not _depth_ok(body):
        raise bad(f"request body nests deeper than {MAX_JSON_DEPTH} levels", None, "invalid_json")
    if not isinstance(body, dict):
        raise bad("request body must be a JSON object", None, "invalid_type")
    return body


def number(body: dict, key: str, default: float, lo: float, hi: float) -> float:
    """``body[key]`` as a finite float in ``[lo, hi]`` (``default`` when absent); a 400 naming the key otherwise."""
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise bad(f"'{key}' must be a number", key, "invalid_type")
    if not lo <= v <= hi:
        raise bad(f"'{key}' must be between {lo:g} and {hi:g}", key)
    return float(v)
