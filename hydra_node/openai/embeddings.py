"""``POST /v1/embeddings``: OpenAI's Embeddings API, served by any hosted model, routed like a generation.

Request (every key below is honoured or refused; any other key is refused with 400 naming it):

* ``model``: a model of the mesh; unknown: 404 ``model_not_found``, as chat; absent or null: the
  mesh's one model (refused naming the models when there are several).
* Served at ``/v1/embeddings`` and, as llama-server does, ``/embeddings``.
* ``input`` (required): a string, a list of strings, a token array, or a list of token arrays;
  1 to 2048 inputs, none empty (OpenAI's limits). Text is tokenised by the host with the model's
  BOS (and EOS where its vocabulary asks); token ids are used as they are. An input longer than
  the host's embedding context (min(the model's training context, 8192) tokens) is refused with
  400 ``context_length_exceeded``.
* ``encoding_format``: ``float`` (default) or ``base64`` (the vector's little-endian float32
  bytes, as OpenAI encodes them).
* ``dimensions``: refused (400 ``dimensions is not supported``): the model's size is fixed.
* ``user``: accepted (a string; OpenAI's end-user id for abuse monitoring: nothing to do here).

Response: ``{"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model",
"usage": {"prompt_tokens", "total_tokens"}}``, vectors L2-normalised (unit length, as OpenAI's),
the model's pooling (its own when its GGUF declares one, else mean); header ``x-hydra-served-by``
names the host. The router picks the host as for a generation (local first); a node that does not
host the model forwards the request to a peer that does (``embed`` stream, 502/503 for a peer's
failure). The work is in :mod:`hydra_node.runtime.child.embed` (the host's runner child).
"""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Sequence

import trio

from hydra_node.http.server import Request, Response
from hydra_node.http.messages import served_by_header
from hydra_node.api.errors import ApiError, bad
from hydra_node.api.body import load_body
from hydra_node.api.model_param import requested_model
from hydra_node.api.router_api import RouterApi
from hydra_node.inference import (
    MAX_EMBEDDING_INPUTS,
    EmbeddingRequest,
    EmbeddingResult,
    GenerationError,
    InvalidRequest,
    vector_floats,
)

__all__ = ["EmbeddingsApi", "parse_embedding_request"]

PATH = "/v1/embeddings"
PATHS = (PATH, "/embeddings")
ENCODINGS = ("float", "base64")
_KEYS = frozenset({"model", "input", "encoding_format", "dimensions", "user"})


def _inputs(raw) -> tuple:
    if isinstance(raw, str):
        return (raw,)
    if not isinstance(raw, list) or not raw:
        raise bad(
            "'input' must be a non-empty string or array",
            "input",
            "missing_required_parameter" if raw is None else "invalid_type",
        )
    if all(type(x) is int for x in raw):  # one token array
        return (tuple(raw),)
    if len(raw) > MAX_EMBEDDING_INPUTS:
        raise bad(f"'input' may hold at most {MAX_EMBEDDING_INPUTS} inputs", "input")
    if all(isinstance(x, str) for x in raw):
        return tuple(raw)
    if all(isinstance(x, list) and all(type(t) is int for t in x) for x in raw):
        return tuple(tuple(x) for x in raw)
    raise bad(
        "'input' must be a string, an array of strings, an array of token ids or an array of token arrays",
        "input",
        "invalid_type",
    )


def parse_embedding_request(raw: bytes, served: Sequence[str] | None = None) -> tuple[EmbeddingRequest, str]:
    """A request body as (:class:`EmbeddingRequest`, encoding_format); :class:`ApiError` 400 for anything else."""
    body = load_body(raw)
    unknown = sorted(k for k in body if k not in _KEYS)
    if unknown:
        raise bad(
            f"unknown parameter {unknown[0]!r}: /v1/embeddings accepts {', '.join(sorted(_KEYS))}",
            unknown[0],
            "unknown_parameter",
        )
    model = requested_model(body, served)  # served: a body without a model is the only one's
    fmt = body.get("encoding_format")
    fmt = "float" if fmt is None else fmt
    if fmt not in ENCODINGS:
        raise bad("'encoding_format' must be 'float' or 'base64'", "encoding_format")
    if body.get("dimensions") is not None:
        raise bad(
            "dimensions is not supported: the model's embedding size is fixed", "dimensions", "unsupported_parameter"
        )
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise bad("'user' must be a string", "user", "invalid_type")
    try:
        req = EmbeddingRequest(model, _inputs(body.get("input")), request_id="emb-" + secrets.token_hex(12))
    except InvalidRequest as exc:
        raise bad(exc.message, exc.param) from None
    return req, fmt


def response_body(req: EmbeddingRequest, result: EmbeddingResult, fmt: str) -> bytes:
    """The JSON body (floats as float32 in their shortest form: 9 significant digits at most)."""
    vectors: list[str] | list[list[float]]
    if fmt == "base64":
        vectors = [base64.b64encode(v).decode("ascii") for v in result.vectors]
    else:
        vectors = [[float(format(x, ".9g")) for x in vector_floats(v)] for v in result.vectors]
    body = {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)],
        "model": req.model,
        "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens},
    }
    return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()


class EmbeddingsApi:
    """``POST /v1/embeddings``; ``router`` provides ``embed(req)``, ``models()`` and ``recently_seen(id)``."""

    def __init__(self, router: RouterApi) -> None:
        self.router = router

    async def handle(self, request: Request) -> Response:
        try:
            return await self._handle(request)
        except ApiError as exc:
            return exc.response()

    async def _handle(self, request: Request) -> Response:
        if (request.path.rstrip("/") or "/") not in PATHS:
            raise ApiError(404, f"no route for {request.method} {request.path}", "not_found")
        if request.method != "POST":
            raise ApiError(405, "use POST", "method_not_allowed")
        req, fmt = parse_embedding_request(request.body, [m.id for m in self.router.models()])
        self._check_model(req.model)
        try:
            result = await self.router.embed(req)
        except GenerationError as exc:
            raise ApiError.from_generation(exc) from None
        # formatting a large reply (2048 vectors) takes a while: off the event loop
        body = await trio.to_thread.run_sync(response_body, req, result, fmt)
        return Response(200, body, "application/json", served_by_header(result.served_by))

    def _check_model(self, model: str) -> None:
        models = [m.id for m in self.router.models()]
        if model not in models and not self.router.recently_seen(model):
            raise ApiError(
                404,
                f"model {model!r} does not exist (available: {', '.join(models) or 'none'})",
                "model_not_found",
                "model",
            )
