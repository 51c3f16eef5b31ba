"""Chat and completion bodies -> :class:`ParsedBody` (pure: bytes in, typed request or :class:`ApiError`).

Every parameter a client may send is either honoured, accepted as harmless (documented as
ignored by design in docs/api.md: :data:`IGNORED`), or refused with a 400 naming it — including
parameters we do not know (OpenAI answers those 400 too). Errors name the parameter the client
sent (``max_completion_tokens``, not ``max_tokens``). The chat-only parts (messages, tools,
response_format) live in :mod:`hydra_node.openai.chat_parse`.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hydra_node.openai.chat_parse import chat_fields
from hydra_node.openai.thinking import reasoning_request
from hydra_node.api.body import MAX_JSON_DEPTH, load_body, number
from hydra_node.api.errors import ApiError, bad
from hydra_node.api.model_param import requested_model
from hydra_node.inference.request import MAX_REPEAT_PENALTY
from hydra_node.inference import (
    MAX_TOKENS_LIMIT,
    MAX_TOP_K,
    NO_CAPS,
    GenerationRequest,
    InvalidRequest,
    ModelCaps,
)

__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_N",
    "MAX_CHOICES",
    "MAX_COMPLETION_LOGPROBS",
    "ParsedBody",
    "load_body",
    "parse_body",
    "parse_request",
    "expand",
]

#: Largest ``n``, and most choices one request may ask for (completions: prompts x n).
MAX_N = 16
MAX_CHOICES = 64
#: Largest completions ``logprobs`` (OpenAI: 5).
MAX_COMPLETION_LOGPROBS = 5

_COMMON = {
    "model",
    "stream",
    "stream_options",
    "n",
    "max_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "user",
    # llama-server's sampling extensions (docs/api.md)
    "top_k",
    "min_p",
    "repeat_penalty",
    "repeat_last_n",
}
#: Accepted and deliberately without effect here (docs/api.md says why for each).
IGNORED = {"metadata", "store", "service_tier", "safety_identifier"}
#: Routing affinity keys (docs/scheduler.md): honoured by the scheduler, no effect on the output.
_AFFINITY = ("session_id", "prompt_cache_key", "user")
_CHAT = (
    _COMMON
    | IGNORED
    | {
        "session_id",
        "prompt_cache_key",
        "messages",
        "max_completion_tokens",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "top_logprobs",
        "modalities",
        "reasoning_effort",
        "chat_template_kwargs",  # llama-server: {"enable_thinking": bool}
        "reasoning_format",  # llama-server: "none" | "auto" | "deepseek"
    }
)
_COMPLETION = _COMMON | IGNORED | {"session_id", "prompt_cache_key", "prompt", "echo", "best_of", "suffix"}
#: Known OpenAI parameters we refuse, with the reason given to the client.
REFUSED = {
    "audio": "audio output is not supported",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "functions": "the legacy 'functions' parameter is not supported: use 'tools'",
    "function_call": "the legacy 'function_call' parameter is not supported: use 'tool_choice'",
    "verbosity": "'verbosity' is not supported",
    "moderation": "moderation is not supported",
    "prompt_cache_options": "'prompt_cache_options' is not supported (the node's prompt cache is configured "
    "in [defaults.model_fit.prefix_cache], not per request)",
    "prompt_cache_retention": "'prompt_cache_retention' is not supported (the node's prompt cache is configured "
    "in [defaults.model_fit.prefix_cache], not per request)",
}

#: What completions refuse besides REFUSED: llama-server's multimodal prompt fields.
TEXT_ONLY = "completions take text only; use /v1/chat/completions with image_url parts"
COMPLETION_REFUSED = {"multimodal_data": TEXT_ONLY, "image_data": TEXT_ONLY}


@dataclass(frozen=True)
class ParsedBody:
    """A parsed request: one :class:`GenerationRequest` per prompt (a chat has one), ``n`` choices each."""

    requests: tuple[GenerationRequest, ...]
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    echo: bool = False  # completions: prepend the prompt text to each choice
    completion_logprobs: int | None = None  # completions' `logprobs` (alternatives per token), None = off
    #: chat ``reasoning_format: "none"``: the thoughts stay in ``content`` (openai/thinking.py)
    inline_reasoning: bool = False

    @property
    def request(self) -> GenerationRequest:
        return self.requests[0]


def _int(body: dict, key: str, lo: int, hi: int) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if type(v) is not int:
        raise bad(f"'{key}' must be an integer", key, "invalid_type")
    if not lo <= v <= hi:
        raise bad(f"'{key}' must be between {lo} and {hi}", key)
    return v


def _bool(body: dict, key: str, default: bool = False) -> bool:
    v = body.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(f"'{key}' must be a boolean", key, "invalid_type")
    return v


def _check_keys(body: dict, allowed: set[str], refused: dict[str, str] = REFUSED) -> None:
    for key in body:
        if key in refused:
            if body[key] is not None:
                raise bad(refused[key], key, "unsupported_parameter")
        elif key not in allowed:
            raise bad(f"Unrecognized request argument supplied: {key}", key, "unknown_parameter")


def _stream_options(body: dict, stream: bool) -> bool:
    opts = body.get("stream_options")
    if opts is None:
        return False
    if not isinstance(opts, dict):
        raise bad("'stream_options' must be an object", "stream_options", "invalid_type")
    if not stream:
        raise bad("'stream_options' is only allowed with 'stream': true", "stream_options")
    for key in opts:
        if key not in ("include_usage", "include_obfuscation"):
            raise bad(f"unknown stream option {key!r}", f"stream_options.{key}", "unknown_parameter")
        if not isinstance(opts[key], bool):
            raise bad(f"'stream_options.{key}' must be a boolean", f"stream_options.{key}", "invalid_type")
    return opts.get("include_usage", False)


def _max_tokens(body: dict) -> int | None:
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    other = body.get("max_tokens")
    if key == "max_completion_tokens" and other is not None and other != body[key]:
        raise bad("'max_tokens' and 'max_completion_tokens' disagree: send one", "max_tokens")
    return _int(body, key, 1, MAX_TOKENS_LIMIT)


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return tuple(stop)
    raise bad("'stop' must be a string or an array of strings", "stop", "invalid_type")


def _logit_bias(body: dict) -> tuple[tuple[int, float], ...]:
    lb = body.get("logit_bias")
    if lb is None:
        return ()
    if not isinstance(lb, dict):
        raise bad("'logit_bias' must be an object mapping token ids to biases", "logit_bias", "invalid_type")
    out = []
    for k, v in lb.items():
        if not (k.isascii() and k.isdigit() and len(k) <= 10 and int(k) < 2**31):
            raise bad(f"'logit_bias' keys must be token ids (decimal strings), not {k!r:.40}", "logit_bias")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
            raise bad(f"'logit_bias' values must be numbers from -100 to 100 (token {k})", "logit_bias")
        out.append((int(k), float(v)))
    return tuple(out)


def _prompts(body: dict) -> list[dict]:
    """Completion prompts as GenerationRequest fields: [{"prompt": str} | {"prompt_tokens": (ids)}]."""
    p = body.get("prompt")
    if p is None:  # OpenAI: "as if from the beginning of a new document" (docs/api.md)
        return [{"prompt": ""}]
    if isinstance(p, str):
        return [{"prompt": p}]
    if isinstance(p, dict) or (isinstance(p, list) and any(isinstance(x, dict) for x in p)):
        # llama-server's {"prompt_string", "multimodal_data"} prompt objects
        raise bad(TEXT_ONLY, "prompt", "unsupported_parameter")
    if isinstance(p, list) and p:
        if all(isinstance(x, str) for x in p):
            return [{"prompt": x} for x in p]
        if all(type(x) is int for x in p):
            return [{"prompt_tokens": tuple(p)}]
        if all(isinstance(x, list) and x and all(type(t) is int for t in x) for x in p):
            return [{"prompt_tokens": tuple(x)} for x in p]
    raise bad(
        "'prompt' must be a string, an array of strings, an array of token ids or an array of "
        "token-id arrays (none empty)",
        "prompt",
        "invalid_type",
    )


def _no_caps(model: str) -> ModelCaps:
    return NO_CAPS


def _sampling_extensions(body: dict) -> dict[str, Any]:
    """llama-server's ``top_k``, ``min_p``, ``repeat_penalty``, ``repeat_last_n`` (absent or null:
    the defaults; ``top_k`` -1, vLLM's "no cut", is 0)."""
    fields: dict[str, Any] = {}
    top_k = _int(body, "top_k", -1, MAX_TOP_K)
    if top_k is not None:
        fields["top_k"] = max(top_k, 0)
    fields["min_p"] = number(body, "min_p", 0.0, 0.0, 1.0)
    fields["repeat_penalty"] = number(body, "repeat_penalty", 1.0, 0.0, MAX_REPEAT_PENALTY)
    last_n = _int(body, "repeat_last_n", 0, MAX_TOKENS_LIMIT)
    if last_n is not None:
        fields["repeat_last_n"] = last_n
    return fields


def parse_body(
    raw: bytes,
    kind: str,
    *,
    served: Sequence[str] | None = None,
    caps: Callable[[str], ModelCaps] = _no_caps,
) -> ParsedBody:
    """Parse a chat (``kind="chat"``) or completion body. Raises :class:`ApiError` (400).

    ``served``: the models the mesh serves (a body without ``model`` is the only one's; None:
    ``model`` is required); ``caps``: what a model can do, asked only when the body uses a
    reasoning control or ``suffix``."""
    body = load_body(raw)
    if kind == "chat":
        _check_keys(body, _CHAT)
    else:
        _check_keys(body, _COMPLETION, REFUSED | COMPLETION_REFUSED)
    model = requested_model(body, served)
    stream = _bool(body, "stream")
    include_usage = _stream_options(body, stream)
    n = _int(body, "n", 1, MAX_N) or 1
    seed = body.get("seed")
    if seed is not None and type(seed) is not int:
        raise bad("'seed' must be an integer", "seed", "invalid_type")
    fields: dict[str, Any] = dict(
        model=model,
        kind=kind,
        max_tokens=_max_tokens(body),
        temperature=number(body, "temperature", 0.8, 0.0, 2.0),
        top_p=number(body, "top_p", 0.95, 0.0, 1.0),
        stop=_stop(body),
        seed=seed,
        presence_penalty=number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        logit_bias=_logit_bias(body),
        **_sampling_extensions(body),
        request_id=("chatcmpl-" if kind == "chat" else "cmpl-") + secrets.token_hex(12),
    )
    for key in _AFFINITY:  # routing affinity key, if the client sent one
        if body.get(key) is not None and not isinstance(body[key], str):
            raise bad(f"'{key}' must be a string", key, "invalid_type")
        if body.get(key) and "session" not in fields:
            fields["session"] = body[key]
    echo, lp, inline = False, None, False
    if kind == "chat":
        fields.update(chat_fields(body))
        reasoning = reasoning_request(body, model, caps)
        fields.update(reasoning.fields)
        inline = reasoning.inline
        per_prompt: list[dict[str, Any]] = [{}]
    else:
        per_prompt = _prompts(body)
        echo = _bool(body, "echo")
        lp = _int(body, "logprobs", 0, MAX_COMPLETION_LOGPROBS)
        if lp is not None:
            fields.update(logprobs=True, top_logprobs=lp)
        _completion_refusals(body, n, echo, lp, per_prompt)
        suffix = _suffix(body, model, caps, per_prompt)
        if suffix:
            fields["suffix"] = suffix
    if len(per_prompt) * n > MAX_CHOICES:
        raise bad(f"at most {MAX_CHOICES} choices per request (prompts x n)", "n")
    try:
        reqs = tuple(GenerationRequest(**fields, **p) for p in per_prompt)
    except InvalidRequest as exc:
        raise bad(exc.message, _sent_param(exc.param, body)) from None
    return ParsedBody(reqs, n, stream, include_usage, echo, lp, inline)


def _suffix(body: dict, model: str, caps: Callable[[str], ModelCaps], prompts: list[dict]) -> str:
    """Completions ``suffix``: fill in the middle between the prompt and it, on a model with FIM
    tokens (else a 400 naming the model)."""
    suffix = body.get("suffix")
    if suffix is None or suffix == "":
        return ""
    if not isinstance(suffix, str):
        raise bad("'suffix' must be a string", "suffix", "invalid_type")
    if any("prompt_tokens" in p for p in prompts):
        raise bad("'suffix' needs a text prompt, not token ids", "suffix", "unsupported_parameter")
    if not caps(model).fim:
        raise bad(
            f"'suffix' (fill-in-the-middle) needs a model with FIM tokens, and {model!r} has none",
            "suffix",
            "unsupported_parameter",
        )
    return suffix


def _completion_refusals(body: dict, n: int, echo: bool, lp: int | None, prompts: list[dict]) -> None:
    best_of = _int(body, "best_of", 1, MAX_N)
    if best_of is not None and best_of not in (1, n):
        raise bad(
            "best_of other than n is not supported (no server-side ranking of extra samples)",
            "best_of",
            "unsupported_parameter",
        )
    if echo and lp is not None:
        raise bad(
            "echo with logprobs is not supported (prompt token logprobs are not computed)",
            "echo",
            "unsupported_parameter",
        )
    if echo and any("prompt_tokens" in p for p in prompts):
        raise bad("echo with a token-id prompt is not supported", "echo", "unsupported_parameter")


def _sent_param(param: str | None, body: dict) -> str | None:
    if param == "max_tokens" and body.get("max_completion_tokens") is not None:
        return "max_completion_tokens"
    return param


def expand(parsed: ParsedBody) -> list[GenerationRequest]:
    """One request per choice, in OpenAI's order (prompt-major, then ``n``): seeds ``seed + i`` when a
    seed was given (so the choices differ), request ids made distinct."""
    out = []
    for p, req in enumerate(parsed.requests):
        for i in range(parsed.n):
            index = p * parsed.n + i
            seed = None if req.seed is None else req.seed + i
            rid = req.request_id if index == 0 else f"{req.request_id}-{index}"
            out.append(req if index == 0 else dataclasses.replace(req, seed=seed, request_id=rid))
    return out


def parse_request(raw: bytes, kind: str) -> tuple[GenerationRequest, bool, bool]:
    """The first request of :func:`parse_body`, with (stream, include_usage_in_stream)."""
    parsed = parse_body(raw, kind)
    return parsed.request, parsed.stream, parsed.include_usage


__all__ += ["IGNORED", "REFUSED", "COMPLETION_REFUSED", "TEXT_ONLY", "ApiError"]
