"""llama-server's own routes on the inference port: ``POST /tokenize``, ``/detokenize`` and ``/infill``.

Parsing and shaping are pure (bodies in, :class:`TokenizeRequest` / a completion body out, or a
400 naming the field); the handler asks the router (a host of the model tokenizes: this node's
runner or a peer). docs/api.md documents each:

* ``/tokenize``: ``{"content", "add_special"=false, "parse_special"=true, "with_pieces"=false}``
  → ``{"tokens": [ids]}``, or with pieces ``{"tokens": [{"id", "piece"}]}`` (a piece that is not
  whole UTF-8 is its bytes, a list of integers, as llama-server sends it);
* ``/detokenize``: ``{"tokens": [ids]}`` → ``{"content"}``;
* ``/infill``: ``input_prefix``, ``input_suffix``, ``prompt`` and the sampling fields →
  llama-server's answer shape (``content``, ``stop``, ``tokens_predicted``…); the middle is filled
  through the model's FIM tokens (a model without them: 400 naming it). ``prompt`` (llama-server
  puts it after the FIM middle token) is joined to the end of ``input_prefix``: the text before
  the cursor either way. ``input_extra`` (other files) is refused unless empty, and so is
  ``stream: true`` (stream with ``/v1/completions`` and ``suffix``).

``model`` may be left out when the mesh serves one model (:mod:`hydra_node.api.model_param`).
"""

from __future__ import annotations

import json
from typing import Any

from hydra_node.api.body import load_body
from hydra_node.api.chat import ChatOutcome
from hydra_node.api.errors import ApiError, bad
from hydra_node.api.fanout import run_all
from hydra_node.api.model_param import requested_model
from hydra_node.http.messages import served_by_header
from hydra_node.http.server import Request, Response, StreamResponse
from hydra_node.inference import GenerationError, InvalidRequest, TokenizeRequest, TokenizeResult
from hydra_node.openai.parse import expand, parse_body
from hydra_node.openai.routes import OpenAIApi
from hydra_node.openai.thinking import THINK_TAGS, inline

__all__ = ["PATHS", "LlamaServerApi", "parse_tokenize", "tokenize_body", "infill_completion_body", "infill_body"]

PATHS = ("/tokenize", "/detokenize", "/infill")
_TOKENIZE_KEYS = {"model", "content", "add_special", "parse_special", "with_pieces"}
_DETOKENIZE_KEYS = {"model", "tokens"}
#: /infill field → the completions field it is (errors name the /infill field).
_INFILL_FIELDS = {
    "n_predict": "max_tokens",
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "repeat_penalty": "repeat_penalty",
    "repeat_last_n": "repeat_last_n",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "seed": "seed",
    "stop": "stop",
}
_INFILL_KEYS = {"model", "input_prefix", "input_suffix", "input_extra", "prompt", "stream", "cache_prompt"} | set(
    _INFILL_FIELDS
)
_PARAM_NAMES = {v: k for k, v in _INFILL_FIELDS.items()} | {"prompt": "input_prefix", "suffix": "input_suffix"}


def _keys(body: dict, allowed: set[str], route: str) -> None:
    for key in body:
        if key not in allowed:
            raise bad(f"{route} does not take {key!r} (docs/api.md lists what it takes)", key, "unknown_parameter")


def _flag(body: dict, key: str, default: bool) -> bool:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(f"'{key}' must be a boolean", key, "invalid_type")
    return v


def parse_tokenize(raw: bytes, op: str, served: list[str] | None) -> TokenizeRequest:
    """A ``/tokenize`` or ``/detokenize`` body. Raises :class:`ApiError` 400."""
    body = load_body(raw)
    _keys(body, _TOKENIZE_KEYS if op == "tokenize" else _DETOKENIZE_KEYS, f"/{op}")
    model = requested_model(body, served)
    try:
        if op == "tokenize":
            content = body.get("content")
            if not isinstance(content, str):
                raise bad("'content' is required and must be a string", "content", "missing_required_parameter")
            return TokenizeRequest(
                model,
                "tokenize",
                content=content,
                add_special=_flag(body, "add_special", False),
                parse_special=_flag(body, "parse_special", True),
                with_pieces=_flag(body, "with_pieces", False),
            )
        tokens = body.get("tokens")
        if not isinstance(tokens, list):
            raise bad("'tokens' is required and must be an array of token ids", "tokens", "missing_required_parameter")
        return TokenizeRequest(model, "detokenize", tokens=tuple(tokens))
    except InvalidRequest as exc:
        raise bad(exc.message, exc.param) from None


def tokenize_body(req: TokenizeRequest, result: TokenizeResult) -> dict[str, Any]:
    """llama-server's answer to ``req``."""
    if req.op == "detokenize":
        return {"content": result.content}
    if not req.with_pieces:
        return {"tokens": list(result.tokens)}
    return {
        "tokens": [
            {"id": t, "piece": p if isinstance(p, str) else list(p)} for t, p in zip(result.tokens, result.pieces)
        ]
    }


def infill_completion_body(body: dict[str, Any], model: str) -> dict[str, Any]:
    """The ``/v1/completions`` body an ``/infill`` body is. Raises :class:`ApiError` 400."""
    _keys(body, _INFILL_KEYS, "/infill")
    extra = body.get("input_extra")
    if extra not in (None, []):
        raise bad(
            "'input_extra' (context from other files) is not supported: send an empty array or leave it out",
            "input_extra",
            "unsupported_parameter",
        )
    if _flag(body, "stream", False):
        raise bad(
            "/infill does not stream here: stream with /v1/completions and 'suffix'", "stream", "unsupported_parameter"
        )
    if not _flag(body, "cache_prompt", True):
        raise bad(
            "'cache_prompt': false is not supported (the prompt cache is the node's: docs/api.md)",
            "cache_prompt",
            "unsupported_parameter",
        )
    texts = {}
    for key in ("input_prefix", "input_suffix", "prompt"):
        v = body.get(key)
        if v is not None and not isinstance(v, str):
            raise bad(f"'{key}' must be a string", key, "invalid_type")
        texts[key] = v or ""
    out: dict[str, Any] = {"model": model, "prompt": texts["input_prefix"] + texts["prompt"]}
    if texts["input_suffix"]:
        out["suffix"] = texts["input_suffix"]
    for key, openai_key in _INFILL_FIELDS.items():
        if body.get(key) is not None:
            out[openai_key] = body[key]
    if isinstance(out.get("max_tokens"), int) and not isinstance(out["max_tokens"], bool) and out["max_tokens"] < 0:
        del out["max_tokens"]  # llama-server: -1 = until the end (here: the host's limit)
    return out


def infill_body(model: str, out: ChatOutcome, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """llama-server's ``/infill`` answer (non-streamed)."""
    reason = out.finish_reason
    return {
        "index": 0,
        "content": inline(out.reasoning, out.content, THINK_TAGS) or "",
        "model": model,
        "stop": True,
        "stop_type": "limit" if reason == "length" else "eos",
        "stopping_word": "",
        "tokens_predicted": completion_tokens,
        "tokens_evaluated": prompt_tokens,
        "truncated": False,
    }


class LlamaServerApi:
    """``/tokenize``, ``/detokenize``, ``/infill``, with ``openai``'s models, capabilities and router."""

    def __init__(self, openai: OpenAIApi):
        self.openai = openai
        self.router = openai.router

    async def handle(self, request: Request) -> Response | StreamResponse:
        path = request.path.rstrip("/") or "/"
        if path not in PATHS:
            raise ApiError(404, f"no route for {request.method} {request.path}", "not_found")
        if request.method != "POST":
            raise ApiError(405, "use POST", "method_not_allowed")
        if path == "/infill":
            return await self._infill(request)
        req = parse_tokenize(request.body, path[1:], self.openai.served())
        self.openai.check_model(req.model)
        try:
            result = await self.router.tokenize(req)
        except GenerationError as exc:
            raise ApiError.from_generation(exc) from None
        return Response.json(200, tokenize_body(req, result), served_by_header(result.served_by))

    async def _infill(self, request: Request) -> Response:
        body = load_body(request.body)
        model = requested_model(body, self.openai.served())
        self.openai.check_model(model)
        if not self.openai.caps(model).fim:
            raise bad(
                f"/infill needs a model with fill-in-the-middle tokens, and {model!r} has none",
                "model",
                "unsupported_model",
            )
        raw = json.dumps(infill_completion_body(body, model)).encode()
        try:
            parsed = parse_body(raw, "completion", caps=self.openai.caps)
        except ApiError as exc:
            exc.param = _PARAM_NAMES.get(exc.param or "", exc.param)
            raise
        try:
            (out,) = await run_all(self.router, expand(parsed))
        except GenerationError as exc:
            raise ApiError.from_generation(exc) from None
        usage = out.usage
        answer = infill_body(model, out, usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0))
        answer["tokens_cached"] = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
        return Response.json(200, answer, served_by_header(out.served_by))
