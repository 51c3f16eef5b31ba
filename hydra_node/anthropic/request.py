"""A ``POST /v1/messages`` body (Anthropic's Messages API) -> :class:`MessagesCall` (pure).

Every field is honoured or refused with a 400 naming it (docs/agents.md has the table). The
conversation becomes the shared chat vocabulary (:class:`ChatMessage`, :class:`ToolCall`,
:class:`ToolSpec`), so the host renders it with the model's own template, exactly as for
``/v1/chat/completions``:

* ``system`` (a string or text blocks) -> one ``system`` message;
* a ``user`` message's ``tool_result`` blocks -> ``tool`` messages (in order, each naming the
  function of the ``tool_use`` it answers; ``is_error: true`` prefixes the text with ``Error: ``),
  its text blocks -> one ``user`` message;
* an ``assistant`` message's text -> its content, its ``tool_use`` blocks -> its calls, its
  ``thinking`` blocks -> its ``reasoning`` (rendered as the model's template wants: docs/reasoning.md;
  the signature is not checked), its ``redacted_thinking`` blocks dropped (encrypted by another
  server: nothing here can read them).

``thinking`` (docs/reasoning.md): ``{"type": "enabled", "budget_tokens": N}`` (N >= 1024 and below
``max_tokens``, as Anthropic checks; refused on a model that does not reason, when the routes know
the model), ``{"type": "disabled"}`` (thinking off), ``{"type": "adaptive"}`` (the model's default;
``output_config.effort`` then sets how much it reasons); ``display`` ``summarized`` (the default:
the thoughts as generated, there being no summariser, as Claude Sonnet 3.7 returns them; ``updates``,
which Claude Code sends, is the same here) or ``omitted`` (thinking blocks with empty text). A ``tool_choice`` that forces a call is refused with
thinking enabled, as Anthropic refuses it. ``context_management`` ``clear_thinking_*`` edits drop
the thoughts of all but the last ``keep`` thinking turns (default 1; ``"all"`` keeps them all).

``cache_control`` on any block is accepted: the host's prefix cache reuses a repeated prompt
prefix on its own, so the hint changes nothing. Documents are refused.

Images (docs/vision.md): ``{"type": "image", "source": {"type": "base64", "media_type", "data"}}``
or ``{"source": {"type": "url", "url": "https://..."}}`` blocks of a ``user`` message, and inside a
``tool_result``'s content (as Anthropic allows: a tool that returns a screenshot), become
:data:`~hydra_node.inference.images.IMAGE_MARK` in the text and one image of the request
(:mod:`hydra_node.api.image_parts`); in ``system`` or an ``assistant`` message they are refused.
A ``file`` source is refused (there is no Files API here).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace

from hydra_node.api.errors import bad
from hydra_node.api.body import load_body, number
from hydra_node.api.image_parts import ImageParts, base64_image, url_image, with_image_parts
from hydra_node.inference.images import ImageBlob, ImageInput
from hydra_node.inference import (
    MAX_STOP_SEQUENCES,
    MAX_TOKENS_LIMIT,
    MAX_TOP_K,
    MAX_TOOLS,
    ChatMessage,
    InvalidRequest,
    ToolCall,
    ToolSpec,
)

__all__ = [
    "DEFAULT_TEMPERATURE",
    "FORCED_TOOL_WITH_THINKING",
    "MAX_MESSAGES",
    "MIN_THINKING_BUDGET",
    "MessagesCall",
    "parse_messages_body",
    "parse_count_tokens_body",
]

#: Anthropic's default temperature (its range is 0-1).
DEFAULT_TEMPERATURE = 1.0
#: Largest accepted conversation, in messages (as ``/v1/chat/completions``).
MAX_MESSAGES = 4096
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_HONOURED = {
    "model",
    "messages",
    "system",
    "max_tokens",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "tools",
    "tool_choice",
    "metadata",
    "service_tier",
    "thinking",
    "context_management",
    "output_config",
    "cache_control",
}
_REFUSED = {
    "container": "containers are not supported",
    "mcp_servers": "MCP servers are not supported",
    "output_format": "structured output formats are not supported on /v1/messages",
}
#: ``thinking`` types, and Anthropic's bounds on an enabled budget.
THINKING_TYPES = ("enabled", "disabled", "adaptive")
#: "updates" (what Claude Code sends first) shows the thoughts as they come, as "summarized" does here.
THINKING_DISPLAYS = ("summarized", "updates", "omitted")
MIN_THINKING_BUDGET = 1024
FORCED_TOOL_WITH_THINKING = "Thinking may not be enabled when tool_choice forces tool use."
_EFFORTS = ("low", "medium", "high", "max")
#: Block keys that never change the output (``cache_control``: the host caches prefixes anyway).
_HARMLESS_BLOCK_KEYS = {"cache_control", "citations"}


@dataclass(frozen=True)
class MessagesCall:
    """What a Messages request asks for, validated."""

    model: str
    messages: tuple[ChatMessage, ...]  # system first when given
    max_tokens: int
    stop_sequences: tuple[str, ...] = ()
    stream: bool = False
    temperature: float = DEFAULT_TEMPERATURE
    top_p: float = 1.0
    top_k: int | None = None  # only the K most likely tokens (None: the host's default)
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str = "auto"  # auto | none | required (Anthropic "any") | function (Anthropic "tool")
    tool_name: str = ""
    parallel_tool_calls: bool = True
    session: str = ""  # metadata.user_id: routing affinity only
    thinking: str = ""  # "" (not given) | enabled | disabled | adaptive
    budget_tokens: int | None = None  # thinking enabled: most thinking tokens
    show_thinking: bool = True  # display "omitted": thinking blocks carry no text
    effort: str | None = None  # output_config.effort
    #: The conversation's images, in the order of their marks in ``messages`` (docs/vision.md).
    images: tuple[ImageBlob | ImageInput, ...] = ()


def _image_block(block: dict, q: str) -> ImageInput:
    """``{"type": "image", "source": {"type": "base64" | "url", ...}}``."""
    _check_block_keys(block, q, {"type", "source"})
    src, sp = block.get("source"), f"{q}.source"
    if not isinstance(src, dict):
        raise bad(
            f"'{sp}' must be an object {{\"type\": \"base64\" | \"url\", ...}}",
            sp,
            "missing_required_parameter" if src is None else "invalid_type",
        )
    kind = src.get("type")
    fields = {"base64": {"type", "media_type", "data"}, "url": {"type", "url"}}.get(
        kind if isinstance(kind, str) else ""
    )
    if kind == "file":
        raise bad(
            f"{sp}: file sources are not supported: send a base64 or url source", f"{sp}.type", "unsupported_parameter"
        )
    if fields is None:
        raise bad(f"'{sp}.type' must be 'base64' or 'url'", f"{sp}.type", "invalid_value")
    for key, value in src.items():
        if key not in fields and value is not None:
            raise bad(f"{sp}.{key} is not a {kind} source field", f"{sp}.{key}", "unknown_parameter")
    if kind == "base64":
        return base64_image(src.get("data"), src.get("media_type"), q, sp)
    url = src.get("url")
    if not isinstance(url, str) or url.split(":", 1)[0].lower() not in ("http", "https"):
        raise bad(f"'{sp}.url' must be an http(s) URL", f"{sp}.url", "invalid_value")
    return url_image(url, q)


def _text_blocks(v, p: str, parts: ImageParts | None = None, images: bool = False) -> str:
    """A string, or a list of text blocks, as text; anything else a 400 naming ``p``. ``parts``
    escapes the text and, where ``images``, takes image blocks (module doc)."""
    if isinstance(v, str):
        return parts.text(v) if parts is not None else v
    if not isinstance(v, list):
        raise bad(f"'{p}' must be a string or an array of text blocks", p, "invalid_type")
    out = []
    for j, block in enumerate(v):
        q = f"{p}[{j}]"
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise bad(f"'{q}' must be a content block object with a 'type'", q, "invalid_type")
        if block["type"] == "image" and parts is not None and images:
            out.append(parts.image(_image_block(block, q)))
            continue
        if block["type"] != "text":
            raise bad(
                f"{q}: {block['type']!r:.40} blocks are not supported here "
                f"(text{' and image' if images else ''} blocks only)",
                f"{q}.type",
                "unsupported_parameter",
            )
        text = _block_text(block, q)
        out.append(parts.text(text) if parts is not None else text)
    return "".join(out)


def _check_block_keys(block: dict, q: str, allowed: set[str]) -> None:
    for key, value in block.items():
        if key not in allowed and key not in _HARMLESS_BLOCK_KEYS and value is not None:
            raise bad(f"{q}.{key} is not supported in a {block['type']!r} block", f"{q}.{key}", "unknown_parameter")


def _block_text(block: dict, q: str) -> str:
    _check_block_keys(block, q, {"type", "text"})
    if not isinstance(block.get("text"), str):
        raise bad(f"'{q}.text' must be a string", f"{q}.text", "invalid_type")
    return block["text"]


def _tool_use(block: dict, q: str) -> ToolCall:
    _check_block_keys(block, q, {"type", "id", "name", "input"})
    if not isinstance(block.get("id"), str) or not block["id"]:
        raise bad(f"'{q}.id' is required", f"{q}.id", "missing_required_parameter")
    if not isinstance(block.get("name"), str) or not block["name"]:
        raise bad(f"'{q}.name' is required", f"{q}.name", "missing_required_parameter")
    if not isinstance(block.get("input"), dict):
        raise bad(f"'{q}.input' must be an object", f"{q}.input", "invalid_type")
    return ToolCall(block["id"], block["name"], json.dumps(block["input"], separators=(",", ":"), ensure_ascii=False))


def _tool_result(block: dict, q: str, names: dict[str, str], parts: ImageParts) -> ChatMessage:
    _check_block_keys(block, q, {"type", "tool_use_id", "content", "is_error"})
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise bad(f"'{q}.tool_use_id' is required", f"{q}.tool_use_id", "missing_required_parameter")
    content = block.get("content")
    text = "" if content is None else _text_blocks(content, f"{q}.content", parts, images=True)
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise bad(f"'{q}.is_error' must be a boolean", f"{q}.is_error", "invalid_type")
    if is_error:
        text = "Error: " + text
    return ChatMessage("tool", text, tool_call_id=call_id, name=names.get(call_id, ""))


def _message(m, p: str, names: dict[str, str], parts: ImageParts) -> list[ChatMessage]:
    if not isinstance(m, dict):
        raise bad(f"'{p}' must be an object", p, "invalid_type")
    role = m.get("role")
    if role not in ("user", "assistant", "system"):
        raise bad(f"'{p}.role' must be 'user', 'assistant' or 'system'", f"{p}.role")
    for key in m:
        if key not in ("role", "content"):
            raise bad(f"{p}.{key} is not a message field", f"{p}.{key}", "unknown_parameter")
    content = m.get("content")
    if isinstance(content, str):
        return [ChatMessage(role, parts.text(content))]
    if role == "system":
        return [ChatMessage("system", _text_blocks(content, f"{p}.content", parts))]
    if not isinstance(content, list):
        raise bad(
            f"'{p}.content' must be a string or an array of content blocks",
            f"{p}.content",
            "missing_required_parameter" if content is None else "invalid_type",
        )
    out: list[ChatMessage] = []
    text: list[str] = []
    calls: list[ToolCall] = []
    thoughts: list[str] = []
    for j, block in enumerate(content):
        q = f"{p}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            text.append(parts.text(_block_text(block, q)))
        elif kind == "image" and role == "user":
            text.append(parts.image(_image_block(block, q)))
        elif kind == "thinking" and role == "assistant":
            thoughts.append(_thinking_block(block, q))
        elif kind == "redacted_thinking" and role == "assistant":
            _check_block_keys(block, q, {"type", "data"})  # encrypted by another server: dropped
        elif kind == "tool_use" and role == "assistant":
            calls.append(_tool_use(block, q))
        elif kind == "tool_result" and role == "user":
            out.append(_tool_result(block, q, names, parts))
        elif kind == "image":
            raise bad(f"{q}: image blocks are allowed only in user messages", f"{q}.type", "unsupported_parameter")
        elif kind in ("document", "search_result"):
            raise bad(
                f"{q}: {kind} blocks are not supported (text and image blocks only)",
                f"{q}.type",
                "unsupported_parameter",
            )
        elif kind in ("tool_use", "tool_result", "thinking", "redacted_thinking"):
            raise bad(
                f"{q}: a {kind} block belongs in a{' user' if kind == 'tool_result' else 'n assistant'} message",
                f"{q}.type",
            )
        else:
            raise bad(
                f"{q}: content blocks of type {kind!r:.40} are not supported", f"{q}.type", "unsupported_parameter"
            )
    names.update((c.id, c.name) for c in calls)
    if text or calls or thoughts or not out:
        out.append(ChatMessage(role, "".join(text), tuple(calls), reasoning="".join(thoughts)))
    return out


def _thinking_block(block: dict, q: str) -> str:
    _check_block_keys(block, q, {"type", "thinking", "signature"})
    if not isinstance(block.get("thinking"), str):
        raise bad(f"'{q}.thinking' must be a string", f"{q}.thinking", "invalid_type")
    if block.get("signature") is not None and not isinstance(block["signature"], str):
        raise bad(f"'{q}.signature' must be a string", f"{q}.signature", "invalid_type")
    return block["thinking"]


def _messages(body: dict, system: str | None, parts: ImageParts) -> tuple[ChatMessage, ...]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad(
            "'messages' must be a non-empty array",
            "messages",
            "missing_required_parameter" if msgs is None else "invalid_type",
        )
    if len(msgs) > MAX_MESSAGES:
        raise bad(f"'messages' has more than {MAX_MESSAGES} entries", "messages")
    out: list[ChatMessage] = [ChatMessage("system", system)] if system else []
    names: dict[str, str] = {}
    for i, m in enumerate(msgs):
        try:
            out.extend(_message(m, f"messages[{i}]", names, parts))
        except InvalidRequest as exc:
            raise bad(f"messages[{i}]: {exc.message}", f"messages[{i}]") from None
    if msgs[-1].get("role") == "assistant" and (
        out[-1].role != "assistant" or out[-1].tool_calls or not out[-1].content
    ):
        raise bad(
            "a final assistant message (prefill) is continued only when it is text: it has tool_use blocks "
            "or no text; end with a user message",
            f"messages[{len(msgs) - 1}]",
            "unsupported_parameter",
        )
    return tuple(out)


def _tools(body: dict) -> tuple[ToolSpec, ...]:
    tools = body.get("tools")
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise bad("'tools' must be an array", "tools", "invalid_type")
    if len(tools) > MAX_TOOLS:
        raise bad(f"'tools' allows at most {MAX_TOOLS} tools", "tools")
    out: list[ToolSpec] = []
    deferred: set[str] = set()
    for i, t in enumerate(tools):
        p = f"tools[{i}]"
        if not isinstance(t, dict):
            raise bad(f"'{p}' must be an object", p, "invalid_type")
        if t.get("type") not in (None, "custom"):
            raise bad(
                f"{p}: server tools ({t.get('type')!r:.40}) are not supported; only custom tools with an input_schema",
                f"{p}.type",
                "unsupported_parameter",
            )
        for key, value in t.items():
            if (
                key not in ("type", "name", "description", "input_schema", "cache_control", "defer_loading")
                and value is not None
            ):
                raise bad(f"{p}.{key} is not a tool field", f"{p}.{key}", "unknown_parameter")
        if t.get("defer_loading") not in (None, False, True):
            raise bad(f"'{p}.defer_loading' must be a boolean", f"{p}.defer_loading", "invalid_type")
        name, desc, schema = t.get("name"), t.get("description"), t.get("input_schema")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise bad(f"{p}.name must be 1-64 letters, digits, '_' or '-'", f"{p}.name")
        if any(s.name == name for s in out):
            raise bad(f"{p}: the tool name {name!r} is used twice", f"{p}.name")
        if desc is not None and not isinstance(desc, str):
            raise bad(f"'{p}.description' must be a string", f"{p}.description", "invalid_type")
        if not isinstance(schema, dict):
            raise bad(
                f"'{p}.input_schema' must be a JSON Schema object",
                f"{p}.input_schema",
                "missing_required_parameter" if schema is None else "invalid_type",
            )
        try:
            spec = ToolSpec(name, desc or "", json.dumps(schema))
        except InvalidRequest as exc:
            raise bad(f"{p}: {exc.message}", p) from None
        out.append(spec)
        if t.get("defer_loading"):
            deferred.add(name)
    # a deferred tool is not loaded into the model's context (Anthropic loads it when its tool search
    # finds it; there is no tool search here), so it is neither shown nor callable
    return tuple(s for s in out if s.name not in deferred)


def _tool_choice(body: dict, tools: tuple[ToolSpec, ...]) -> tuple[str, str, bool]:
    """``(choice, name, parallel)`` in the chat vocabulary."""
    tc = body.get("tool_choice")
    if tc is None:
        return "auto", "", True
    kind = tc.get("type") if isinstance(tc, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise bad("'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}", "tool_choice")
    allowed = {"type", "disable_parallel_tool_use"} | ({"name"} if kind == "tool" else set())
    for key in tc:
        if key not in allowed:
            raise bad(f"tool_choice.{key} does not go with type {kind!r}", f"tool_choice.{key}", "unknown_parameter")
    no_parallel = tc.get("disable_parallel_tool_use")
    if no_parallel is not None and not isinstance(no_parallel, bool):
        raise bad(
            "'tool_choice.disable_parallel_tool_use' must be a boolean",
            "tool_choice.disable_parallel_tool_use",
            "invalid_type",
        )
    if kind != "none" and not tools:
        raise bad(f"tool_choice {kind!r} needs 'tools'", "tool_choice")
    name = ""
    if kind == "tool":
        name = tc.get("name")
        if not isinstance(name, str) or name not in {t.name for t in tools}:
            raise bad(f"'tool_choice.name' must name one of 'tools' (got {name!r:.60})", "tool_choice.name")
    choice = {"auto": "auto", "any": "required", "tool": "function", "none": "none"}[kind]
    return choice, name, not no_parallel


def _stop_sequences(body: dict) -> tuple[str, ...]:
    stops = body.get("stop_sequences")
    if stops is None:
        return ()
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise bad("'stop_sequences' must be an array of non-empty strings", "stop_sequences", "invalid_type")
    if len(stops) > MAX_STOP_SEQUENCES:
        raise bad(f"'stop_sequences' allows at most {MAX_STOP_SEQUENCES} sequences here", "stop_sequences")
    return tuple(stops)


def _neutral_fields(body: dict) -> str:
    """Checks the fields that change nothing; returns the session key (``metadata.user_id``)."""
    for key, value in body.items():
        if key in _REFUSED and value is not None:
            raise bad(_REFUSED[key], key, "unsupported_parameter")
        if key not in _HONOURED and key not in _REFUSED and value is not None:
            raise bad(f"unknown parameter '{key}'", key, "unknown_parameter")
    if body.get("service_tier") not in (None, "auto", "standard_only"):
        raise bad("'service_tier' must be 'auto' or 'standard_only' (there are no tiers here)", "service_tier")
    edits = body.get("context_management")
    if edits is not None and not _clears_thinking_only(edits):
        raise bad(
            "'context_management' may only clear thinking blocks (clear_thinking_*, with 'keep' \"all\" or "
            "{\"type\": \"thinking_turns\", \"value\": N}); other edits are not supported",
            "context_management",
            "unsupported_parameter",
        )
    cache = body.get("cache_control")
    if cache is not None and not isinstance(cache, dict):
        raise bad("'cache_control' must be an object", "cache_control", "invalid_type")
    config = body.get("output_config")
    if config is not None and not (
        isinstance(config, dict) and set(config) <= {"effort"} and config.get("effort") in (None, *_EFFORTS)
    ):
        raise bad(
            "'output_config' may only hold an 'effort' (low, medium, high, max: it sets how much a "
            "reasoning model reasons; it changes nothing for a model that does not reason)",
            "output_config",
            "unsupported_parameter",
        )
    meta = body.get("metadata")
    if meta is None:
        return ""
    if not isinstance(meta, dict) or set(meta) - {"user_id"}:
        raise bad("'metadata' may only hold 'user_id'", "metadata", "invalid_type")
    user = meta.get("user_id")
    if user is not None and not isinstance(user, str):
        raise bad("'metadata.user_id' must be a string", "metadata.user_id", "invalid_type")
    return user or ""


def _clears_thinking_only(v) -> bool:
    """``{"edits": [{"type": "clear_thinking_...", "keep": ...}]}`` (what :func:`_kept_turns` reads)."""
    if not isinstance(v, dict) or set(v) - {"edits"} or not isinstance(v.get("edits", []), list):
        return False
    for e in v.get("edits", []):
        if (
            not isinstance(e, dict)
            or not str(e.get("type", "")).startswith("clear_thinking_")
            or set(e) - {"type", "keep"}
        ):
            return False
        try:
            _keep(e.get("keep"))
        except ValueError:
            return False
    return True


def _keep(keep) -> int | None:
    """Thinking turns a clear_thinking edit keeps (None: all). ValueError for another shape."""
    if keep is None:
        return 1
    if keep == "all":
        return None
    if isinstance(keep, dict) and keep.get("type") == "thinking_turns" and set(keep) <= {"type", "value"}:
        value = keep.get("value")
        if type(value) is int and value >= 0:
            return value
    raise ValueError("keep")


def _kept_turns(body: dict) -> int | None:
    """The fewest thinking turns any clear_thinking edit keeps (None: no edit clears any)."""
    edits = (body.get("context_management") or {}).get("edits") or []
    kept = [k for k in (_keep(e.get("keep")) for e in edits) if k is not None]
    return min(kept) if kept else None


def _clear_thinking(messages: tuple[ChatMessage, ...], keep: int | None) -> tuple[ChatMessage, ...]:
    """``messages`` with the thoughts of all but the last ``keep`` assistant turns that have any."""
    if keep is None:
        return messages
    thinking = [i for i, m in enumerate(messages) if m.reasoning]
    cleared = set(thinking[: len(thinking) - keep]) if keep < len(thinking) else set()
    return tuple(replace(m, reasoning="") if i in cleared else m for i, m in enumerate(messages))


def _thinking(body: dict, max_tokens: int | None, tool_choice: str) -> tuple[str, int | None, bool]:
    """``(type, budget_tokens, show)`` of ``thinking`` (``max_tokens`` None: count_tokens, no bound)."""
    thinking = body.get("thinking")
    if thinking is None:
        return "", None, True
    if not isinstance(thinking, dict) or thinking.get("type") not in THINKING_TYPES:
        raise bad(
            "'thinking' must be {\"type\": \"enabled\", \"budget_tokens\": N}, {\"type\": \"disabled\"} or "
            "{\"type\": \"adaptive\"}",
            "thinking",
            "invalid_value",
        )
    kind = thinking["type"]
    allowed = {"type", "display"} | ({"budget_tokens"} if kind == "enabled" else set())
    for key, value in thinking.items():
        if key not in allowed and value is not None:
            raise bad(f"thinking.{key} does not go with type {kind!r}", f"thinking.{key}", "unknown_parameter")
    display = thinking.get("display")
    if display is not None and display not in THINKING_DISPLAYS:
        raise bad(
            "'thinking.display' must be 'summarized', 'updates' or 'omitted'", "thinking.display", "invalid_value"
        )
    budget = thinking.get("budget_tokens")
    if kind == "enabled":
        if type(budget) is not int:
            raise bad(
                "'thinking.budget_tokens' is required with thinking enabled and must be an integer",
                "thinking.budget_tokens",
                "missing_required_parameter" if budget is None else "invalid_type",
            )
        if budget < MIN_THINKING_BUDGET:
            raise bad(f"'thinking.budget_tokens' must be at least {MIN_THINKING_BUDGET}", "thinking.budget_tokens")
        if max_tokens is not None and budget >= max_tokens:
            raise bad(
                f"'max_tokens' must be greater than 'thinking.budget_tokens' (max_tokens {max_tokens}, "
                f"budget_tokens {budget}): thinking counts toward max_tokens",
                "max_tokens",
            )
        if tool_choice in ("required", "function"):
            raise bad(FORCED_TOOL_WITH_THINKING, "tool_choice")
    return kind, budget, display != "omitted"


def _conversation(
    body: dict,
) -> tuple[tuple[ChatMessage, ...], tuple[ToolSpec, ...], tuple[ImageInput, ...]]:
    system = body.get("system")

    def parse(parts: ImageParts) -> tuple[ChatMessage, ...]:
        text = None if system is None else _text_blocks(system, "system", parts)
        return _messages(body, text, parts)

    messages, images = with_image_parts(parse)
    return _clear_thinking(messages, _kept_turns(body)), _tools(body), images


def _effort(body: dict) -> str | None:
    config = body.get("output_config")
    return config.get("effort") if isinstance(config, dict) else None


def parse_messages_body(raw: bytes) -> MessagesCall:
    """Parse and validate a ``/v1/messages`` body. Raises ApiError (400) naming the field."""
    body = load_body(raw)
    session = _neutral_fields(body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("'model' is required and must be a string", "model", "missing_required_parameter")
    max_tokens = body.get("max_tokens")
    if type(max_tokens) is not int:
        raise bad(
            "'max_tokens' is required and must be an integer",
            "max_tokens",
            "missing_required_parameter" if max_tokens is None else "invalid_type",
        )
    if not 1 <= max_tokens <= MAX_TOKENS_LIMIT:
        raise bad(f"'max_tokens' must be between 1 and {MAX_TOKENS_LIMIT}", "max_tokens")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad("'stream' must be a boolean", "stream", "invalid_type")
    messages, tools, images = _conversation(body)
    choice, name, parallel = _tool_choice(body, tools)
    thinking, budget, show = _thinking(body, max_tokens, choice)
    if thinking == "enabled" and messages[-1].role == "assistant":
        raise bad(
            "a final assistant message (prefill) cannot be continued with thinking enabled (as Anthropic's API)",
            "thinking",
            "unsupported_parameter",
        )
    top_k = body.get("top_k")
    if top_k is not None and (type(top_k) is not int or not 1 <= top_k <= MAX_TOP_K):
        raise bad(f"'top_k' must be an integer between 1 and {MAX_TOP_K}", "top_k")
    return MessagesCall(
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        stop_sequences=_stop_sequences(body),
        stream=bool(stream),
        temperature=number(body, "temperature", DEFAULT_TEMPERATURE, 0, 1),
        top_p=number(body, "top_p", 1.0, 0, 1),
        top_k=top_k,
        tools=tools,
        tool_choice=choice,
        tool_name=name,
        parallel_tool_calls=parallel,
        session=session,
        thinking=thinking,
        budget_tokens=budget,
        show_thinking=show,
        effort=_effort(body),
        images=images,
    )


_COUNT_FIELDS = {
    "model",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "thinking",
    "context_management",
    "output_config",
}


def parse_count_tokens_body(raw: bytes) -> MessagesCall:
    """``/v1/messages/count_tokens``: model, messages, system, tools, tool_choice and the neutral
    fields of ``/v1/messages``; no ``max_tokens``."""
    body = load_body(raw)
    for key, value in body.items():
        if key not in _COUNT_FIELDS and value is not None:
            raise bad(f"unknown parameter '{key}'", key, "unknown_parameter")
    _neutral_fields(body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("'model' is required and must be a string", "model", "missing_required_parameter")
    messages, tools, images = _conversation(body)
    choice, name, parallel = _tool_choice(body, tools)
    thinking, budget, show = _thinking(body, None, choice)
    return MessagesCall(
        model=model,
        messages=messages,
        max_tokens=1,
        tools=tools,
        tool_choice=choice,
        tool_name=name,
        parallel_tool_calls=parallel,
        temperature=0.0,
        thinking=thinking,
        budget_tokens=budget,
        show_thinking=show,
        effort=_effort(body),
        images=images,
    )
