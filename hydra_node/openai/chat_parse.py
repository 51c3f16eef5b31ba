"""The chat-only parts of a chat completions body: messages, tools, tool_choice, response_format, logprobs.

Image parts (``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..." | "https://...",
"detail": "auto" | "low" | "high"}}``, or ``"image_url": "URL"``) are allowed in ``user`` messages
only (OpenAI's rule); each becomes :data:`~hydra_node.inference.images.IMAGE_MARK` in the
message's content and one :class:`ImageInput` in ``images`` (:mod:`hydra_node.api.image_parts`: in
a request with images, the text's own U+FFFC become U+FFFD). ``input_audio`` and ``file`` parts
are refused, naming the part.

:func:`chat_fields` returns :class:`GenerationRequest` fields; the grammar that enforces forced tool
calls or a JSON response format is built here, on the API node (:mod:`hydra_node.grammar.constraints`).
Tool choice ``auto`` gets the lazy form (free text until the model writes ``<tool_call>``, then
the call must match a tool's schema); ``required`` or a named function gets the full grammar;
``none`` gets no grammar (the tools are still shown to the model, as OpenAI does).
"""

from __future__ import annotations

import json
import re

from hydra_node.grammar import constraints as grammar  # built on the API node, enforced by the host's sampler
from hydra_node.api.errors import bad
from hydra_node.api.image_parts import ImageParts, url_image, with_image_parts
from hydra_node.inference import MAX_TOOLS, MAX_TOP_LOGPROBS_REQUEST, ChatMessage, InvalidRequest, ToolCall, ToolSpec
from hydra_node.inference.images import ImageInput

__all__ = ["MAX_MESSAGES", "chat_fields"]

#: Largest accepted chat history, in messages.
MAX_MESSAGES = 4096
_ROLES = ("system", "developer", "user", "assistant", "tool")
_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: Keys a message may carry, by role (a key with a null value is always accepted).
_MESSAGE_KEYS = {
    "system": {"role", "content"},
    "developer": {"role", "content"},
    "user": {"role", "content"},
    # reasoning_content: the turn's thoughts (llama-server's and DeepSeek's extension)
    "assistant": {"role", "content", "tool_calls", "refusal", "reasoning_content"},
    "tool": {"role", "content", "tool_call_id"},
}
_MESSAGE_REFUSALS = {
    "name": "participant names are not supported",
    "audio": "audio is not supported",
    "function_call": "the legacy 'function_call' is not supported: use 'tool_calls'",
}


def _image_url_part(part: dict, q: str) -> ImageInput:
    """``{"type": "image_url", "image_url": {"url", "detail"}}`` (or ``"image_url": "URL"``)."""
    for key, v in part.items():
        if key not in ("type", "image_url") and v is not None:
            raise bad(f"{q}.{key} is not an image_url part field", f"{q}.{key}", "unknown_parameter")
    iu = part.get("image_url")
    if isinstance(iu, str):
        return url_image(iu, q)
    if not isinstance(iu, dict):
        raise bad(f"'{q}.image_url' must be an object {{\"url\", \"detail\"}}", f"{q}.image_url", "invalid_type")
    for key, v in iu.items():
        if key not in ("url", "detail") and v is not None:
            raise bad(f"{q}.image_url.{key} is not an image_url field", f"{q}.image_url.{key}", "unknown_parameter")
    return url_image(iu.get("url"), q, iu.get("detail"))


def _content(m: dict, p: str, nullable: bool, parts: ImageParts) -> str:
    content = m.get("content")
    if isinstance(content, str):
        return parts.text(content)
    if content is None:
        if nullable:
            return ""
        raise bad(f"'{p}.content' is required", f"{p}.content", "missing_required_parameter")
    if isinstance(content, list):  # [{"type": "text", "text": "..."}, {"type": "image_url", ...}]
        texts = []
        for j, part in enumerate(content):
            q = f"{p}.content[{j}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                texts.append(parts.text(part["text"]))
            elif kind == "image_url":
                if m.get("role") != "user":
                    raise bad(f"{q}: image_url parts are allowed only in user messages", f"{q}.type", "invalid_value")
                texts.append(parts.image(_image_url_part(part, q)))
            elif kind in ("input_audio", "file"):
                raise bad(
                    f"{q}: {kind} parts are not supported (audio/file parts are not supported: "
                    "send text and image_url parts)",
                    q,
                    "unsupported_parameter",
                )
            else:
                raise bad(f"{q}: only text and image_url parts are supported", q)
        return "".join(texts)
    raise bad(f"{p}.content must be a string or an array of content parts", f"{p}.content", "invalid_type")


def _tool_calls(m: dict, p: str) -> tuple[ToolCall, ...]:
    calls = m.get("tool_calls")
    if calls is None:
        return ()
    if not isinstance(calls, list):
        raise bad(f"'{p}.tool_calls' must be an array", f"{p}.tool_calls", "invalid_type")
    out = []
    for j, c in enumerate(calls):
        q = f"{p}.tool_calls[{j}]"
        fn = c.get("function") if isinstance(c, dict) else None
        if not (
            isinstance(c, dict)
            and c.get("type", "function") == "function"
            and isinstance(c.get("id"), str)
            and isinstance(fn, dict)
            and isinstance(fn.get("name"), str)
            and isinstance(fn.get("arguments", "{}"), str)
        ):
            raise bad(f"{q} must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}", q)
        out.append(ToolCall(c["id"], fn["name"], fn.get("arguments", "{}")))
    return tuple(out)


def _messages(body: dict, parts: ImageParts) -> tuple[ChatMessage, ...]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad(
            "'messages' must be a non-empty array",
            "messages",
            "missing_required_parameter" if msgs is None else "invalid_type",
        )
    if len(msgs) > MAX_MESSAGES:
        raise bad(f"'messages' has more than {MAX_MESSAGES} entries", "messages")
    out: list[ChatMessage] = []
    call_names: dict[str, str] = {}
    for i, m in enumerate(msgs):
        p = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(f"{p} must be an object", p, "invalid_type")
        role = m.get("role")
        if role not in _ROLES:
            raise bad(f"{p}.role must be one of {', '.join(_ROLES)}", f"{p}.role")
        for key, v in m.items():
            if key not in _MESSAGE_KEYS[role] and v is not None:
                raise bad(
                    f"{p}.{key}: " + _MESSAGE_REFUSALS.get(key, f"unknown message field for role {role}"),
                    f"{p}.{key}",
                    "unsupported_parameter",
                )
        if m.get("refusal") is not None:
            raise bad(f"{p}.refusal is not supported", f"{p}.refusal", "unsupported_parameter")
        calls = _tool_calls(m, p) if role == "assistant" else ()
        content = _content(m, p, role == "assistant", parts)
        thoughts = m.get("reasoning_content") if role == "assistant" else None
        if thoughts is not None and not isinstance(thoughts, str):
            raise bad(f"'{p}.reasoning_content' must be a string", f"{p}.reasoning_content", "invalid_type")
        try:
            if role == "tool":
                call_id = m.get("tool_call_id")
                if not isinstance(call_id, str) or not call_id:
                    raise bad(f"'{p}.tool_call_id' is required", f"{p}.tool_call_id", "missing_required_parameter")
                out.append(ChatMessage("tool", content, tool_call_id=call_id, name=call_names.get(call_id, "")))
            else:
                out.append(
                    ChatMessage("system" if role == "developer" else role, content, calls, reasoning=thoughts or "")
                )
        except InvalidRequest as exc:
            raise bad(f"{p}: {exc.message}", p) from None
        call_names.update((c.id, c.name) for c in calls)
    return tuple(out)


def _tools(body: dict) -> tuple[ToolSpec, ...]:
    tools = body.get("tools")
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise bad("'tools' must be an array", "tools", "invalid_type")
    if len(tools) > MAX_TOOLS:
        raise bad(f"'tools' allows at most {MAX_TOOLS} functions", "tools")
    out: list[ToolSpec] = []
    for i, t in enumerate(tools):
        p = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function":
            raise bad(f"{p}: only tools of type 'function' are supported", f"{p}.type", "unsupported_parameter")
        for key in t:
            if key not in ("type", "function"):
                raise bad(f"{p}.{key} is not a tool field", f"{p}.{key}", "unknown_parameter")
        fn = t.get("function")
        if not isinstance(fn, dict):
            raise bad(f"'{p}.function' must be an object", f"{p}.function", "invalid_type")
        for key in fn:
            if key not in ("name", "description", "parameters", "strict"):
                raise bad(f"{p}.function.{key} is not a function field", f"{p}.function.{key}", "unknown_parameter")
        name = fn.get("name")
        if not isinstance(name, str) or not _FUNCTION_NAME.fullmatch(name):
            raise bad(f"{p}.function.name must be 1-64 letters, digits, '_' or '-'", f"{p}.function.name")
        if any(s.name == name for s in out):
            raise bad(f"{p}: the function name {name!r} is used twice", f"{p}.function.name")
        desc, params = fn.get("description"), fn.get("parameters")
        if desc is not None and not isinstance(desc, str):
            raise bad(f"'{p}.function.description' must be a string", f"{p}.function.description", "invalid_type")
        if params is not None and not isinstance(params, dict):
            raise bad(
                f"'{p}.function.parameters' must be a JSON Schema object", f"{p}.function.parameters", "invalid_type"
            )
        if fn.get("strict") is not None and not isinstance(fn["strict"], bool):
            raise bad(f"'{p}.function.strict' must be a boolean", f"{p}.function.strict", "invalid_type")
        try:
            out.append(
                ToolSpec(
                    name, desc or "", json.dumps(params if params is not None else {"type": "object", "properties": {}})
                )
            )
        except InvalidRequest as exc:
            raise bad(f"{p}: {exc.message}", p) from None
    return tuple(out)


def _tool_choice(body: dict, tools: tuple[ToolSpec, ...]) -> tuple[str, str]:
    tc = body.get("tool_choice")
    if tc is None:
        return "auto", ""
    if tc in ("auto", "none", "required"):
        return tc, ""
    fn = tc.get("function") if isinstance(tc, dict) else None
    if (
        isinstance(tc, dict)
        and tc.get("type") == "function"
        and isinstance(fn, dict)
        and isinstance(fn.get("name"), str)
    ):
        if fn["name"] not in {t.name for t in tools}:
            raise bad(f"'tool_choice' names {fn['name']!r}, which is not in 'tools'", "tool_choice")
        return "function", fn["name"]
    raise bad(
        "'tool_choice' must be 'auto', 'none', 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}",
        "tool_choice",
    )


def _response_format_grammar(body: dict) -> str:
    rf = body.get("response_format")
    if rf is None:
        return ""
    kind = rf.get("type") if isinstance(rf, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        raise bad("'response_format.type' must be 'text', 'json_object' or 'json_schema'", "response_format.type")
    for key in rf:
        if key not in ("type", "json_schema") or (key == "json_schema" and kind != "json_schema"):
            raise bad(
                f"response_format.{key} does not go with type {kind!r}", f"response_format.{key}", "unknown_parameter"
            )
    if kind == "text":
        return ""
    if kind == "json_object":
        return grammar.json_object_grammar()
    js, p = rf.get("json_schema"), "response_format.json_schema"
    if not isinstance(js, dict):
        raise bad(f"'{p}' must be an object with 'name' and 'schema'", p, "invalid_type")
    for key in js:
        if key not in ("name", "schema", "strict", "description"):
            raise bad(f"{p}.{key} is not a json_schema field", f"{p}.{key}", "unknown_parameter")
    if not isinstance(js.get("name"), str) or not _FUNCTION_NAME.fullmatch(js["name"]):
        raise bad(f"{p}.name must be 1-64 letters, digits, '_' or '-'", f"{p}.name")
    if not isinstance(js.get("schema"), dict):
        raise bad(f"'{p}.schema' must be a JSON Schema object", f"{p}.schema", "invalid_type")
    if js.get("strict") is not None and not isinstance(js["strict"], bool):
        raise bad(f"'{p}.strict' must be a boolean", f"{p}.strict", "invalid_type")
    if js.get("description") is not None and not isinstance(js["description"], str):
        raise bad(f"'{p}.description' must be a string", f"{p}.description", "invalid_type")
    return grammar.json_schema_grammar(js["schema"], param=f"{p}.schema")


def chat_fields(body: dict) -> dict:
    """The :class:`GenerationRequest` fields of a chat body. Raises ApiError (400)."""
    if body.get("modalities") not in (None, ["text"]):
        raise bad(
            "only text output is supported: 'modalities' must be [\"text\"]", "modalities", "unsupported_parameter"
        )
    tools = _tools(body)
    choice, name = _tool_choice(body, tools)
    parallel = body.get("parallel_tool_calls", True)
    if parallel is None:
        parallel = True
    if not isinstance(parallel, bool):
        raise bad("'parallel_tool_calls' must be a boolean", "parallel_tool_calls", "invalid_type")
    logprobs, top = body.get("logprobs"), body.get("top_logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise bad("'logprobs' must be a boolean", "logprobs", "invalid_type")
    if top is not None and (type(top) is not int or not 0 <= top <= MAX_TOP_LOGPROBS_REQUEST):
        raise bad(f"'top_logprobs' must be an integer from 0 to {MAX_TOP_LOGPROBS_REQUEST}", "top_logprobs")
    if top and not logprobs:
        raise bad("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    messages, images = with_image_parts(lambda parts: _messages(body, parts))
    fields = dict(
        messages=messages,
        images=images,
        tools=tools,
        tool_choice=choice,
        tool_name=name,
        parallel_tool_calls=parallel,
        logprobs=bool(logprobs),
        top_logprobs=top or 0,
    )
    try:
        rf_grammar = _response_format_grammar(body)
        if rf_grammar and tools and choice != "none":
            raise bad(
                "'response_format' with tools is not supported unless 'tool_choice' is 'none'",
                "response_format",
                "unsupported_parameter",
            )
        if rf_grammar:
            fields["grammar"] = rf_grammar
        elif tools and choice != "none":
            fields["grammar"] = grammar.tool_call_grammar(tools, name=name or None, parallel=parallel)
            if choice == "auto":
                fields["grammar_triggers"] = (grammar.TOOL_CALL_TRIGGER,)
    except InvalidRequest as exc:
        raise bad(exc.message, exc.param) from None
    return fields
