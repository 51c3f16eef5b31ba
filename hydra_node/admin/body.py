"""What every management route shares: one JSON-body parser (:func:`json_body`) and one mapping of
the typed errors the routes raise to their answers (:func:`error_response`, applied to a route
table by :func:`guarded`), so the same fault gets the same status and code on every route.

The refusals of a body (docs/api.md, "The management API"):

======================================================  ======  ==============================
fault                                                   status  code
======================================================  ======  ==============================
larger than the route's bound                           413     ``body_too_large``
not JSON (or not UTF-8, or nested past 64 levels)       400     ``invalid_json``
not an object; a field of the wrong JSON type           400     ``invalid_type``
a field the route does not take                         400     ``unknown_parameter``
a required field absent, null or ``""``                 400     ``missing_required_parameter``
a value of the right type the route refuses             400     ``invalid_value``
======================================================  ======  ==============================

The codes are those the OpenAI-compatible port already answers (``api/body.py``,
``openai/parse.py``), so both ports speak one vocabulary.  An optional field given as ``null`` is
taken as absent; an empty body as ``{}``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from hydra_node.admin.management import Handler
from hydra_node.api.body import load_body
from hydra_node.api.errors import ApiError
from hydra_node.http.server import Request, Response, StreamResponse
from hydra_node.inference import GenerationError
from hydra_node.runtime.artifacts.errors import ArtifactError, IdentityMismatch
from hydra_node.runtime.fetch.errors import DownloadError, NotInMesh

__all__ = ["ANSWERED", "Fields", "error_response", "guarded", "json_body"]

#: Field name → the JSON type(s) it takes: ``str``, ``bool``, ``int``, ``float``, ``dict``, ``list``.
Fields = Mapping[str, type | tuple[type, ...]]
_NONE: Fields = MappingProxyType({})
_NAMES = {
    str: "a string",
    bool: "true or false",
    int: "an integer",
    float: "a number",
    dict: "an object",
    list: "an array",
}
#: The typed errors :func:`guarded` answers (anything else is a bug: the server's 500).
ANSWERED = (ApiError, ArtifactError, GenerationError, DownloadError)


def _is(value: Any, types: type | tuple[type, ...]) -> bool:
    types = types if isinstance(types, tuple) else (types,)
    return bool in types if isinstance(value, bool) else isinstance(value, types)  # true is no number here


def json_body(
    request: Request, *, required: Fields = _NONE, optional: Fields = _NONE, max_bytes: int
) -> dict[str, Any]:
    """The request's body: a JSON object of at most ``max_bytes`` holding every ``required`` field and
    no field outside ``required`` and ``optional``, each of its type; optional nulls are dropped.
    Anything else raises the :class:`ApiError` of the table above, naming the field."""
    if len(request.body) > max_bytes:
        raise ApiError(413, f"body larger than {max_bytes} bytes", "body_too_large")
    body = load_body(request.body) if request.body.strip() else {}
    known = {**required, **optional}
    unknown = sorted(set(body) - set(known))
    if unknown:
        raise ApiError(
            400,
            f"unknown field {unknown[0][:60]!r} (known: {', '.join(known) or 'none'})",
            "unknown_parameter",
            unknown[0][:60],
        )
    for key, types in known.items():
        value = body.get(key)
        if key in required and (value is None or value == ""):
            raise ApiError(400, f"{key!r} is required", "missing_required_parameter", key)
        if value is None:
            body.pop(key, None)
        elif not _is(value, types):
            names = " or ".join(_NAMES.get(t, t.__name__) for t in (types if isinstance(types, tuple) else (types,)))
            raise ApiError(400, f"{key!r} must be {names}", "invalid_type", key)
    return body


def error_response(exc: ApiError | ArtifactError | GenerationError | DownloadError) -> Response:
    """The answer to one of :data:`ANSWERED`: an :class:`ApiError` as it is; an artifact error with its
    own status and code (an identity mismatch with ``fields``); a generation error as the OpenAI port
    answers it; a model fetch from peers 404 ``not_in_mesh`` or 502 with its code."""
    if isinstance(exc, ArtifactError):
        extra = {"fields": exc.fields} if isinstance(exc, IdentityMismatch) else None
        return ApiError(exc.status, exc.message, exc.code, extra=extra).response()
    if isinstance(exc, GenerationError):
        return ApiError.from_generation(exc).response()
    if isinstance(exc, DownloadError):
        return ApiError(404 if isinstance(exc, NotInMesh) else 502, str(exc), exc.code).response()
    return exc.response()


def guarded(routes: Mapping[tuple[str, str], Handler]) -> dict[tuple[str, str], Handler]:
    """``routes`` with each handler's :data:`ANSWERED` errors answered by :func:`error_response`."""

    def guard(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def handle(request: Request) -> Response | StreamResponse:
            try:
                return await handler(request)
            except ANSWERED as exc:
                return error_response(exc)

        return handle

    return {key: guard(handler) for key, handler in routes.items()}
