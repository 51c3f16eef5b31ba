"""Responses API input items -> chat history (pure).

``input`` is a string (one user message) or a list of items: messages (``role`` user, system,
developer or assistant; ``content`` a string or a list of ``input_text``/``output_text`` parts),
``function_call`` items (an assistant's call), ``function_call_output`` items (a tool's
result: a string or input_text / input_image parts) and ``reasoning`` items (a reasoning model's thoughts, as this API outputs them). They
become :class:`ChatMessage` s: a developer message is a system message, an assistant message
followed by its function calls is one assistant message with ``tool_calls``, a function call
output is a ``tool`` message naming the call it answers, and a reasoning item is the
``reasoning`` of the assistant turn that follows it (its message or calls; a reasoning item with
no assistant item after it is an assistant turn of its own, with no text). Anything else is an
:class:`ApiError` (400) naming the item.

Images (docs/vision.md): ``{"type": "input_image", "image_url": "data:<type>;base64,..." |
"https://...", "detail"}`` parts of user messages and of function call outputs become
:data:`~hydra_node.inference.images.IMAGE_MARK` in the text and one image of the request
(:mod:`hydra_node.api.image_parts`); ``file_id``, ``input_file`` and ``input_audio`` are refused.

A reasoning item's thoughts are the texts of its ``content`` (``reasoning_text`` parts), or, when
it has none, of its ``summary`` (``summary_text`` parts: what another server returned). An
``encrypted_content`` cannot be read here (it is another server's): one that is not empty is
refused, naming the item.
"""

from __future__ import annotations

from collections.abc import Sequence

from hydra_node.api.errors import bad
from hydra_node.api.image_parts import ImageParts, url_image
from hydra_node.inference import ChatMessage, InvalidRequest, ToolCall
from hydra_node.inference.images import ImageInput

__all__ = ["MAX_INPUT_ITEMS", "input_messages"]

#: Most input items one request may carry (the chat API's MAX_MESSAGES).
MAX_INPUT_ITEMS = 4096

_MESSAGE_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
_TEXT_PARTS = ("input_text", "output_text")
#: Fields an input item may carry that do not change what is generated (ids, statuses, labels);
#: any other field is refused unless it is null.
_ITEM_EXTRAS = {
    "message": {"id", "status", "phase"},
    "function_call": {"id", "status", "namespace"},
    "function_call_output": {"id", "status", "name", "namespace"},
    "reasoning": {"id", "status"},
}
_PART_EXTRAS = {"annotations", "logprobs"}
#: Parts refused with their reason (images are ``input_image`` parts).
_REFUSED_PARTS = {
    "input_file": "file parts are not supported",
    "input_audio": "audio parts are not supported",
}


def _input_image(part: dict, p: str) -> ImageInput:
    """``{"type": "input_image", "image_url": "data:..." | "https://...", "detail"}``."""
    for key, v in part.items():
        if key not in ("type", "image_url", "detail", "file_id") and v is not None:
            raise bad(f"'{p}' has unsupported field {key!r}", f"{p}.{key}", "unknown_parameter")
    if part.get("file_id") is not None:
        raise bad(f"{p}: file ids are not supported: send image_url", f"{p}.file_id", "unsupported_parameter")
    if part.get("image_url") is None:
        raise bad(f"'{p}.image_url' is required", f"{p}.image_url", "missing_required_parameter")
    return url_image(part["image_url"], p, part.get("detail"))


def _text_parts(
    content,
    param: str,
    allowed: Sequence[str],
    sep: str = "",
    parts: ImageParts | None = None,
    images: bool = False,
) -> str:
    """Text parts joined; ``parts`` escapes the text and, where ``images``, takes ``input_image`` parts."""
    if isinstance(content, str):
        return parts.text(content) if parts is not None else content
    if not isinstance(content, list):
        raise bad(f"'{param}' must be a string or an array of text parts", param, "invalid_type")
    texts = []
    for j, part in enumerate(content):
        p = f"{param}[{j}]"
        if not isinstance(part, dict):
            raise bad(f"'{p}' must be an object", p, "invalid_type")
        kind = part.get("type")
        if kind == "input_image" and parts is not None:
            if not images:
                raise bad(f"{p}: input_image parts are allowed only in user messages", f"{p}.type")
            texts.append(parts.image(_input_image(part, p)))
            continue
        if kind in _REFUSED_PARTS:
            raise bad(f"{p}: {_REFUSED_PARTS[kind]}", f"{p}.type", "unsupported_parameter")
        if kind not in allowed:
            hint = "input_image parts are accepted in user messages and function_call_output"
            raise bad(
                f"'{p}.type' {kind!r:.40} is not supported here (supported: {', '.join(allowed)}; {hint})",
                f"{p}.type",
            )
        if not isinstance(part.get("text"), str):
            raise bad(f"'{p}.text' must be a string", f"{p}.text", "invalid_type")
        unknown = {k for k, v in part.items() if v is not None} - {"type", "text"} - _PART_EXTRAS
        if unknown:
            raise bad(f"'{p}' has unsupported field {min(unknown)!r}", f"{p}.{min(unknown)}", "unknown_parameter")
        texts.append(parts.text(part["text"]) if parts is not None else part["text"])
    return sep.join(texts)


def _string(item: dict, key: str, param: str, *, required: bool = True) -> str:
    v = item.get(key)
    if v is None and not required:
        return ""
    if not isinstance(v, str) or (required and not v and key != "arguments"):
        raise bad(
            f"'{param}.{key}' must be a non-empty string",
            f"{param}.{key}",
            "missing_required_parameter" if v is None else "invalid_type",
        )
    return v


def _check_fields(item: dict, kind: str, required: set[str], param: str) -> None:
    unknown = {k for k, v in item.items() if v is not None} - required - {"type"} - _ITEM_EXTRAS[kind]
    if unknown:
        name = min(unknown)
        raise bad(f"'{param}' ({kind}) has unsupported field {name!r}", f"{param}.{name}", "unknown_parameter")


def _reasoning_text(item: dict, param: str) -> str:
    """The thoughts of a ``reasoning`` input item (module doc)."""
    _check_fields(item, "reasoning", {"summary", "content", "encrypted_content"}, param)
    if item.get("encrypted_content"):
        raise bad(
            f"'{param}.encrypted_content' cannot be read here: encrypted reasoning comes from another "
            "server (this one returns reasoning items with their thoughts in 'content' and no "
            "encrypted_content); drop the item, or send its thoughts as 'content'",
            f"{param}.encrypted_content",
            "unsupported_parameter",
        )
    summary = item.get("summary")
    if not isinstance(summary, list):
        raise bad(
            f"'{param}.summary' must be an array of summary_text parts ([] when there is none)",
            f"{param}.summary",
            "missing_required_parameter" if summary is None else "invalid_type",
        )
    content = item.get("content")
    if content is not None and not isinstance(content, list):
        raise bad(f"'{param}.content' must be an array of reasoning_text parts", f"{param}.content", "invalid_type")
    text = _text_parts(content or [], f"{param}.content", ("reasoning_text",))
    brief = _text_parts(summary, f"{param}.summary", ("summary_text",), sep="\n\n")
    return text or brief


def _call_names(history: Sequence[ChatMessage]) -> dict[str, str]:
    return {c.id: c.name for m in history for c in m.tool_calls}


def input_messages(value, history: Sequence[ChatMessage] = (), parts: ImageParts | None = None) -> list[ChatMessage]:
    """``input`` as chat messages. ``history`` (a previous response's conversation) is only read
    to name the function a ``function_call_output`` answers. ``parts`` takes the images
    (``input_image`` parts of user messages and of function call outputs) and escapes the text
    (hydra_node/api/image_parts.py); None: image parts are refused as any unknown part."""
    if isinstance(value, str):
        return [_message("user", parts.text(value) if parts is not None else value, "input")]
    if not isinstance(value, list):
        raise bad(
            "'input' must be a string or an array of input items",
            "input",
            "missing_required_parameter" if value is None else "invalid_type",
        )
    if len(value) > MAX_INPUT_ITEMS:
        raise bad(f"'input' has more than {MAX_INPUT_ITEMS} items", "input")
    names = _call_names(history)
    out: list[ChatMessage] = []
    thoughts = ""  # a reasoning item's, waiting for the assistant turn it led to
    for i, item in enumerate(value):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad(f"'{param}' must be an object", param, "invalid_type")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "reasoning":
            if thoughts:  # two in a row (no answer between them): the first is a turn of its own
                out.append(_message("assistant", "", param, reasoning=thoughts))
            thoughts = _reasoning_text(item, param)
            continue
        if thoughts and not (kind == "message" and item.get("role") == "assistant") and kind != "function_call":
            out.append(_message("assistant", "", param, reasoning=thoughts))
            thoughts = ""
        if kind == "message":
            _check_fields(item, "message", {"role", "content"}, param)
            role = item.get("role")
            if not isinstance(role, str) or role not in _MESSAGE_ROLES:  # a list or object is unhashable
                raise bad(
                    f"'{param}.role' must be one of {', '.join(_MESSAGE_ROLES)}",
                    f"{param}.role",
                    "missing_required_parameter" if role is None else "invalid_value",
                )
            text = _text_parts(item.get("content"), f"{param}.content", _TEXT_PARTS, parts=parts, images=role == "user")
            out.append(_message(_MESSAGE_ROLES[role], text, param, reasoning=thoughts))
            thoughts = ""
        elif kind == "function_call":
            _check_fields(item, "function_call", {"call_id", "name", "arguments"}, param)
            call = ToolCall(
                _string(item, "call_id", param), _string(item, "name", param), _string(item, "arguments", param)
            )
            names[call.id] = call.name
            prev = out[-1] if out else None
            if prev is not None and prev.role == "assistant" and not prev.tool_call_id:
                out[-1] = _message(
                    "assistant", prev.content, param, prev.tool_calls + (call,), reasoning=prev.reasoning + thoughts
                )
            else:
                out.append(_message("assistant", "", param, (call,), reasoning=thoughts))
            thoughts = ""
        elif kind == "function_call_output":
            _check_fields(item, "function_call_output", {"call_id", "output"}, param)
            call_id = _string(item, "call_id", param)
            output = _text_parts(
                item.get("output"), f"{param}.output", ("input_text", "output_text"), parts=parts, images=True
            )
            name = _string(item, "name", param, required=False) or names.get(call_id, "")
            out.append(_message("tool", output, param, tool_call_id=call_id, name=name))
        else:
            raise bad(
                f"'{param}.type' {kind!r:.40} is not supported: input items are messages, function_call, "
                "function_call_output and reasoning",
                f"{param}.type",
            )
    if thoughts:
        out.append(_message("assistant", "", f"input[{len(value) - 1}]", reasoning=thoughts))
    return out


def _message(
    role: str,
    content: str,
    param: str,
    calls: tuple[ToolCall, ...] = (),
    *,
    tool_call_id: str = "",
    name: str = "",
    reasoning: str = "",
) -> ChatMessage:
    try:
        return ChatMessage(role, content, calls, tool_call_id, name, reasoning)
    except InvalidRequest as exc:
        raise bad(exc.message, param) from None
