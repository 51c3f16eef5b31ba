"""A ``POST /v1/responses`` body -> :class:`ResponsesCall` (pure).

Every field of OpenAI's request is either honoured or refused with a 400 naming it; fields that
cannot change what is generated are accepted only with their neutral values (``truncation:
"disabled"``, ``background: false``, ...). ``reasoning.effort`` is kept for
:func:`hydra_node.responses.constraints.generation_request`, which maps it for the model (or refuses
it on a model that does not reason: docs/reasoning.md); ``reasoning.summary`` may only be ``auto``
(there is no summariser: every reasoning item's ``summary`` is ``[]``, its thoughts are in
``content``). The call keeps the echo of what was asked (tools, tool_choice, text format,
metadata, reasoning, ...) for the response object.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hydra_node.api.errors import bad
from hydra_node.api.body import number
from hydra_node.api.image_parts import ESCAPED_MARK, with_image_parts
from hydra_node.responses.items import input_messages
from hydra_node.inference import (
    MAX_TOKENS_LIMIT,
    MAX_TOOLS,
    MAX_TOP_LOGPROBS_REQUEST,
    ChatMessage,
    InvalidRequest,
    ToolSpec,
)
from hydra_node.inference.images import IMAGE_MARK, ImageBlob, ImageInput

__all__ = [
    "DEFAULT_TEMPERATURE",
    "DEFAULT_TOP_P",
    "LOGPROBS_INCLUDE",
    "REASONING_SUMMARIES",
    "ResponsesCall",
    "parse_responses_body",
]

#: Sampling defaults when the request names none (the chat API's), echoed in the response.
DEFAULT_TEMPERATURE = 0.8
DEFAULT_TOP_P = 0.95
#: OpenAI's metadata bounds: 16 pairs, keys up to 64 characters, values up to 512.
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512
_FORMAT_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: Includes we honour: logprobs of the output text, and encrypted reasoning, trivially: reasoning
#: items carry their thoughts in plain ``content`` and never an ``encrypted_content``.
LOGPROBS_INCLUDE = "message.output_text.logprobs"
_INCLUDES = {"reasoning.encrypted_content", LOGPROBS_INCLUDE}
#: ``reasoning.summary`` values accepted: "auto" asks for the best summary there is, and there is none.
REASONING_SUMMARIES = ("auto",)


#: Fields accepted only with a value that changes nothing; anything else is refused, naming them.
_NEUTRAL: dict[str, tuple[Callable[[object], bool], str]] = {
    "truncation": (lambda v: v in (None, "disabled"), "only 'disabled' (a prompt that does not fit is an error)"),
    "service_tier": (lambda v: v in (None, "auto", "default"), "only 'auto' or 'default'"),
    "background": (lambda v: v in (None, False), "background responses are not supported"),
    "stream_options": (
        lambda v: (
            v is None
            or (
                isinstance(v, dict)
                and v.get("include_obfuscation") in (None, False)
                and set(v) <= {"include_obfuscation"}
            )
        ),
        "only include_obfuscation: false (streams are never padded)",
    ),
    "max_tool_calls": (lambda v: v is None, "not supported"),
    "conversation": (lambda v: v is None, "conversations are not supported; use previous_response_id"),
    "prompt": (lambda v: v is None, "stored prompt templates are not supported"),
    "prompt_cache_retention": (lambda v: v is None, "not supported"),
    "prompt_cache_options": (lambda v: v is None, "not supported"),
    "context_management": (lambda v: v in (None, []), "not supported"),
    "moderation": (lambda v: v is None, "not supported"),
    "image": (lambda v: v is None, "not supported"),
    "access_programs": (lambda v: v is None, "not supported"),
    "background_options": (lambda v: v is None, "not supported"),
}
_HONOURED = {
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "temperature",
    "top_p",
    "max_output_tokens",
    "text",
    "previous_response_id",
    "store",
    "metadata",
    "stream",
    "include",
    "top_logprobs",
    "user",
    "prompt_cache_key",
    "safety_identifier",
    "reasoning",
}


@dataclass(frozen=True)
class ResponsesCall:
    """What a Responses request asks for, validated."""

    model: str
    history: tuple[ChatMessage, ...]  # previous response's conversation + this input (no instructions)
    instructions: str | None = None
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str = "auto"  # auto | none | required | function
    tool_name: str = ""
    parallel_tool_calls: bool = True
    temperature: float = DEFAULT_TEMPERATURE
    top_p: float = DEFAULT_TOP_P
    max_output_tokens: int | None = None
    text_format: dict = field(default_factory=lambda: {"type": "text"})
    previous_response_id: str | None = None
    store: bool = True
    store_asked: bool = False  # the request said "store": true itself (not the default)
    stream: bool = False
    logprobs: bool = False  # include has message.output_text.logprobs
    top_logprobs: int = 0
    session: str = ""
    metadata: dict = field(default_factory=dict)
    echo: dict = field(default_factory=dict)  # the rest of what the response object repeats
    reasoning_effort: str | None = None  # reasoning.effort as asked (None: not given)
    reasoning_summary: str | None = None  # reasoning.summary: None or "auto"
    #: The input's images, in the order of their marks in ``history`` (docs/vision.md).
    images: tuple[ImageBlob | ImageInput, ...] = ()

    @property
    def messages(self) -> tuple[ChatMessage, ...]:
        if self.instructions:
            return (ChatMessage("system", self.instructions),) + self.history
        return self.history

    def response_fields(self) -> dict:
        """The request fields a response object repeats (OpenAI's shapes)."""
        choice: str | dict = (
            {"type": "function", "name": self.tool_name} if self.tool_choice == "function" else self.tool_choice
        )
        return {
            "instructions": self.instructions,
            "metadata": dict(self.metadata),
            "parallel_tool_calls": self.parallel_tool_calls,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_output_tokens": self.max_output_tokens,
            "tool_choice": choice,
            "top_logprobs": self.top_logprobs,
            "tools": self.echo.get("tools", []),
            "text": {"format": dict(self.text_format)},
            "previous_response_id": self.previous_response_id,
            "store": self.store,
            "truncation": "disabled",
            "reasoning": {"effort": self.reasoning_effort, "summary": self.reasoning_summary},
            "service_tier": "default",
            "background": False,
            **{k: self.echo[k] for k in ("user", "safety_identifier", "prompt_cache_key") if k in self.echo},
        }


def _typed(body: dict, key: str, kind: type, what: str):
    v = body.get(key)
    if v is not None and (not isinstance(v, kind) or (kind is int and isinstance(v, bool))):
        raise bad(f"'{key}' must be {what}", key, "invalid_type")
    return v


def _metadata(v) -> dict:
    if v is None:
        return {}
    if not isinstance(v, dict) or len(v) > MAX_METADATA_PAIRS:
        raise bad(f"'metadata' must be an object of at most {MAX_METADATA_PAIRS} string pairs", "metadata")
    for k, val in v.items():
        if len(k) > MAX_METADATA_KEY or not isinstance(val, str) or len(val) > MAX_METADATA_VALUE:
            raise bad(
                f"'metadata' keys are strings of at most {MAX_METADATA_KEY} characters and values strings "
                f"of at most {MAX_METADATA_VALUE}",
                "metadata",
            )
    return dict(v)


def _tools(v) -> tuple[tuple[ToolSpec, ...], list[dict]]:
    if v is None:
        return (), []
    if not isinstance(v, list):
        raise bad("'tools' must be an array", "tools", "invalid_type")
    if len(v) > MAX_TOOLS:
        raise bad(f"'tools' allows at most {MAX_TOOLS} functions", "tools")
    specs: list[ToolSpec] = []
    echo: list[dict] = []
    for i, t in enumerate(v):
        p = f"tools[{i}]"
        if not isinstance(t, dict):
            raise bad(f"'{p}' must be an object", p, "invalid_type")
        if t.get("type") != "function":
            raise bad(
                f"'{p}.type' {t.get('type')!r:.40} is not supported: only function tools are "
                "(no built-in tools such as web_search, file_search or computer use)",
                f"{p}.type",
            )
        neutral = {"defer_loading": (None, False), "output_schema": (None,), "allowed_callers": (None, ["direct"])}
        for key, ok in neutral.items():
            if t.get(key) not in ok:
                raise bad(f"'{p}.{key}' is not supported", f"{p}.{key}", "unsupported_parameter")
        unknown = set(t) - {"type", "name", "description", "parameters", "strict"} - set(neutral)
        if unknown:
            raise bad(f"'{p}' has unsupported field {min(unknown)!r}", f"{p}.{min(unknown)}", "unknown_parameter")
        name, desc, params, strict = t.get("name"), t.get("description"), t.get("parameters"), t.get("strict")
        if not isinstance(name, str) or not _FORMAT_NAME.fullmatch(name):
            raise bad(f"'{p}.name' must be 1 to 64 letters, digits, '_' or '-'", f"{p}.name")
        if desc is not None and not isinstance(desc, str):
            raise bad(f"'{p}.description' must be a string", f"{p}.description", "invalid_type")
        if params is not None and not isinstance(params, dict):
            raise bad(f"'{p}.parameters' must be a JSON Schema object", f"{p}.parameters", "invalid_type")
        if strict is not None and not isinstance(strict, bool):
            raise bad(f"'{p}.strict' must be a boolean", f"{p}.strict", "invalid_type")
        if name in {s.name for s in specs}:
            raise bad(f"'tools' names the function {name!r} twice", f"{p}.name")
        schema = params if params is not None else {"type": "object", "properties": {}}
        try:
            specs.append(ToolSpec(name, desc or "", json.dumps(schema)))
        except InvalidRequest as exc:
            raise bad(exc.message, p) from None
        echo.append(
            {
                "type": "function",
                "name": name,
                "description": desc,
                "parameters": schema,
                "strict": True if strict is None else strict,
            }
        )
    return tuple(specs), echo


def _tool_choice(v, tools: Sequence[ToolSpec]) -> tuple[str, str]:
    if v is None:
        return "auto", ""
    if v in ("auto", "none", "required"):
        if v == "required" and not tools:
            raise bad("'tool_choice' 'required' needs 'tools'", "tool_choice")
        return v, ""
    if isinstance(v, dict) and v.get("type") == "function" and set(v) <= {"type", "name"}:
        name = v.get("name")
        if not isinstance(name, str) or name not in {t.name for t in tools}:
            raise bad(f"'tool_choice' names {name!r:.70}, which is not a function in 'tools'", "tool_choice")
        return "function", name
    raise bad(
        "'tool_choice' must be 'auto', 'none', 'required' or {\"type\": \"function\", \"name\": ...} "
        "(allowed_tools and built-in tool choices are not supported)",
        "tool_choice",
    )


def _logprobs(body: dict) -> tuple[bool, int]:
    include = body.get("include")
    if include is None:
        include = []
    if not isinstance(include, list) or not all(isinstance(x, str) and x in _INCLUDES for x in include):
        raise bad(
            f"'include' may hold only {' and '.join(sorted(_INCLUDES))} (no search results, images or code outputs)",
            "include",
            "unsupported_parameter",
        )
    top = body.get("top_logprobs")
    if top is not None and (type(top) is not int or not 0 <= top <= MAX_TOP_LOGPROBS_REQUEST):
        raise bad(f"'top_logprobs' must be an integer from 0 to {MAX_TOP_LOGPROBS_REQUEST}", "top_logprobs")
    if top and LOGPROBS_INCLUDE not in include:
        raise bad(f"'top_logprobs' needs 'include': ['{LOGPROBS_INCLUDE}']", "top_logprobs")
    return LOGPROBS_INCLUDE in include, top or 0


def _reasoning(v) -> tuple[str | None, str | None]:
    """``(effort, summary)`` of ``reasoning``; the effort is checked against the model later."""
    if v is None:
        return None, None
    if not isinstance(v, dict):
        raise bad("'reasoning' must be an object with 'effort' and 'summary'", "reasoning", "invalid_type")
    unknown = {k for k, val in v.items() if val is not None} - {"effort", "summary", "generate_summary"}
    if unknown:
        name = min(unknown)
        raise bad(f"'reasoning' has unsupported field {name!r}", f"reasoning.{name}", "unknown_parameter")
    effort = v.get("effort")
    if effort is not None and not isinstance(effort, str):
        raise bad("'reasoning.effort' must be a string", "reasoning.effort", "invalid_type")
    summary = None
    for key in ("summary", "generate_summary"):  # generate_summary: the deprecated name
        asked = v.get(key)
        if asked is not None and asked not in REASONING_SUMMARIES:
            raise bad(
                f"'reasoning.{key}' {asked!r:.40} is not supported: only 'auto' (there is no reasoning "
                "summariser here: reasoning items carry the thoughts themselves in 'content', and "
                "'summary' is [])",
                f"reasoning.{key}",
                "unsupported_parameter",
            )
        summary = summary or asked
    return effort, summary


def _text_format(v) -> dict:
    if v is None:
        return {"type": "text"}
    if not isinstance(v, dict) or set(v) - {"format", "verbosity"}:
        raise bad("'text' must be an object with 'format'", "text", "invalid_type")
    if v.get("verbosity") is not None:
        raise bad("'text.verbosity' is not supported", "text.verbosity", "unsupported_parameter")
    fmt = v.get("format")
    if fmt is None:
        return {"type": "text"}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind in ("text", "json_object") and set(fmt) == {"type"}:
        return {"type": kind}
    if kind != "json_schema":
        raise bad(
            "'text.format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or a json_schema format",
            "text.format",
        )
    unknown = set(fmt) - {"type", "name", "schema", "strict", "description"}
    if unknown:
        raise bad(f"'text.format' has unsupported field {min(unknown)!r}", "text.format", "unknown_parameter")
    name, schema, strict, desc = fmt.get("name"), fmt.get("schema"), fmt.get("strict"), fmt.get("description")
    if not isinstance(name, str) or not _FORMAT_NAME.fullmatch(name):
        raise bad("'text.format.name' must be 1 to 64 letters, digits, '_' or '-'", "text.format.name")
    if not isinstance(schema, dict):
        raise bad(
            "'text.format.schema' must be a JSON Schema object",
            "text.format.schema",
            "missing_required_parameter" if schema is None else "invalid_type",
        )
    if strict is not None and not isinstance(strict, bool):
        raise bad("'text.format.strict' must be a boolean", "text.format.strict", "invalid_type")
    if desc is not None and not isinstance(desc, str):
        raise bad("'text.format.description' must be a string", "text.format.description", "invalid_type")
    out = {"type": "json_schema", "name": name, "schema": schema, "strict": bool(strict)}
    if desc is not None:
        out["description"] = desc
    return out


def parse_responses_body(raw: bytes, previous: Callable[[str], Sequence[ChatMessage] | None]) -> ResponsesCall:
    """Parse and validate a request body; ``previous(id)`` is a stored response's conversation or None."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad(f"request body is not valid JSON: {exc}", None, "invalid_json") from None
    if not isinstance(body, dict):
        raise bad("request body must be a JSON object", None, "invalid_type")
    for key in body:
        if key in _NEUTRAL:
            ok, why = _NEUTRAL[key]
            if not ok(body[key]):
                raise bad(f"'{key}' is not supported with this value: {why}", key, "unsupported_parameter")
        elif key not in _HONOURED and body[key] is not None:
            raise bad(f"unknown parameter '{key}'", key, "unknown_parameter")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("'model' is required and must be a string", "model", "missing_required_parameter")
    stream = _typed(body, "stream", bool, "a boolean") or False
    store = _typed(body, "store", bool, "a boolean")
    parallel = _typed(body, "parallel_tool_calls", bool, "a boolean")
    instructions = _typed(body, "instructions", str, "a string")
    max_out = _typed(body, "max_output_tokens", int, "an integer")
    if max_out is not None and not 1 <= max_out <= MAX_TOKENS_LIMIT:
        raise bad(f"'max_output_tokens' must be between 1 and {MAX_TOKENS_LIMIT}", "max_output_tokens")
    echo = {}
    for key in ("user", "safety_identifier", "prompt_cache_key"):
        if _typed(body, key, str, "a string") is not None:
            echo[key] = body[key]
    session = next((echo[k] for k in ("prompt_cache_key", "user", "safety_identifier") if echo.get(k)), "")
    prev_id = _typed(body, "previous_response_id", str, "a string")
    history: Sequence[ChatMessage] = ()
    if prev_id is not None:
        found = previous(prev_id)
        if found is None:
            raise _not_found(prev_id)
        history = tuple(found)
        if any(IMAGE_MARK in m.content for m in history):
            raise bad(
                f"previous response {prev_id!r:.80} had images, which this node does not keep: send the "
                "conversation again as 'input', its images included (without previous_response_id)",
                "previous_response_id",
                "unsupported_parameter",
            )
    tools, echo["tools"] = _tools(body.get("tools"))
    choice, name = _tool_choice(body.get("tool_choice"), tools)
    logprobs, top_logprobs = _logprobs(body)
    effort, summary = _reasoning(body.get("reasoning"))
    new, images = with_image_parts(lambda parts: input_messages(body.get("input"), history, parts))
    messages = tuple(history) + tuple(new)
    if images and instructions and IMAGE_MARK in instructions:  # marks and images pair up (docs/vision.md)
        instructions = instructions.replace(IMAGE_MARK, ESCAPED_MARK)
    if not messages:
        raise bad("'input' must not be empty", "input", "missing_required_parameter")
    return ResponsesCall(
        model=model,
        history=messages,
        instructions=instructions,
        tools=tools,
        tool_choice=choice,
        tool_name=name,
        parallel_tool_calls=True if parallel is None else parallel,
        temperature=number(body, "temperature", DEFAULT_TEMPERATURE, -math.inf, math.inf),
        top_p=number(body, "top_p", DEFAULT_TOP_P, -math.inf, math.inf),
        max_output_tokens=max_out,
        text_format=_text_format(body.get("text")),
        previous_response_id=prev_id,
        store=True if store is None else store,
        store_asked=store is True,
        stream=stream,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        session=session,
        metadata=_metadata(body.get("metadata")),
        echo=echo,
        reasoning_effort=effort,
        reasoning_summary=summary,
        images=images,
    )


def _not_found(prev_id: str):
    return bad(
        f"previous response {prev_id!r:.80} not found (never stored, created with store: false, or "
        "evicted from this node's bounded store)",
        "previous_response_id",
        "previous_response_not_found",
    )
