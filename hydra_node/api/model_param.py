"""Which model a request names (pure): the body's ``model``, or the one model the mesh serves.

llama-server serves one model and does not need ``model``; so a body without one (or with
``null``) is served when the mesh has exactly one model, and refused with a 400 naming the models
otherwise, so a client never lands on a model it did not choose (docs/api.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hydra_node.api.errors import bad

__all__ = ["requested_model"]


def requested_model(body: dict[str, Any], served: Sequence[str] | None, *, param: str = "model") -> str:
    """``body[param]``, or the only id in ``served`` when it is absent or null (``served`` None: the
    caller has no default, the model is required). Raises :class:`ApiError` 400."""
    model = body.get(param)
    if model is None:
        if served is not None and len(served) == 1:
            return served[0]
        if not served:
            why = "" if served is None else " (this mesh serves no model yet)"
        else:
            why = f" (this mesh serves {len(served)} models: {', '.join(served)}; name one)"
        raise bad(f"'{param}' is required{why}", param, "missing_required_parameter")
    if not isinstance(model, str) or not model:
        raise bad(f"'{param}' must be a non-empty string", param, "invalid_type")
    return model
