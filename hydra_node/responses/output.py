"""Chat outcomes -> Responses API output items and response objects (pure).

A reasoning model's thoughts become one ``reasoning`` item first (``summary`` ``[]``: there is no
summariser; the thoughts in one ``reasoning_text`` part of ``content``; never an
``encrypted_content``); a generation's text becomes one ``message`` output item (one
``output_text`` part, whose ``logprobs`` are ``[]`` unless they were asked for); each tool call
becomes a ``function_call`` item. ``finish_reason`` ``length`` makes the response
``incomplete`` with ``incomplete_details.reason`` ``max_output_tokens``. Ids are drawn from an
injected ``token`` function so tests can fix them.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from hydra_node.api.chat import served_by_field
from hydra_node.responses.request import ResponsesCall
from hydra_node.inference import ChatMessage, TokenLogprob, ToolCall

__all__ = [
    "CallLike",
    "call_item",
    "conversation_after",
    "delta_logprobs",
    "message_item",
    "new_id",
    "output_items",
    "reasoning_item",
    "response_body",
    "response_status",
    "text_logprobs",
    "usage_body",
]


class CallLike(Protocol):
    """A parsed tool call (``hydra_node.api.chat.ParsedToolCall``): what an output item needs (read-only)."""

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def arguments(self) -> str: ...


def new_id(prefix: str, token: Callable[[int], str] = secrets.token_hex) -> str:
    return f"{prefix}_{token(24)}"


def usage_body(usage: dict) -> dict:
    """A chat ``usage`` (prompt/completion/total tokens) in the Responses shape."""
    details = usage.get("prompt_tokens_details") or {}
    inp, out = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    return {
        "input_tokens": inp,
        "output_tokens": out,
        "total_tokens": inp + out,
        "input_tokens_details": {"cached_tokens": int(details.get("cached_tokens", 0)), "cache_write_tokens": 0},
        "output_tokens_details": {
            "reasoning_tokens": int((usage.get("completion_tokens_details") or {}).get("reasoning_tokens", 0))
        },
    }


def text_logprobs(entries: Sequence[TokenLogprob]) -> list[dict]:
    """Token logprobs as an ``output_text`` part carries them (bytes as lists of ints)."""
    return [
        {
            "token": e.token,
            "bytes": list(e.bytes),
            "logprob": e.logprob,
            "top_logprobs": [{"token": t, "bytes": list(b), "logprob": p} for t, p, b in e.top],
        }
        for e in entries
    ]


def delta_logprobs(entries: Sequence[TokenLogprob]) -> list[dict]:
    """Token logprobs as ``response.output_text.delta``/``.done`` events carry them."""
    return [
        {"token": e.token, "logprob": e.logprob, "top_logprobs": [{"token": t, "logprob": p} for t, p, _b in e.top]}
        for e in entries
    ]


def message_item(
    item_id: str, text: str, status: str = "completed", logprobs: Sequence[TokenLogprob] | None = None
) -> dict:
    """A message item; its text part's ``logprobs`` are ``[]`` unless they were asked for
    (``logprobs`` not None; the schema requires the field)."""
    part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    if logprobs is not None:
        part["logprobs"] = text_logprobs(logprobs)
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": [part]}


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict:
    """A reasoning item: the thoughts in one ``reasoning_text`` part, no summary."""
    return {
        "type": "reasoning",
        "id": item_id,
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": status,
    }


def call_item(item_id: str, call: CallLike, status: str = "completed") -> dict:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": status,
    }


def response_status(finish_reason: str) -> tuple[str, dict | None]:
    """(status, incomplete_details) for a chat finish reason."""
    if finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    return "completed", None


def output_items(
    content: str | None,
    calls: Sequence[CallLike],
    finish_reason: str,
    token: Callable[[int], str] = secrets.token_hex,
    logprobs: Sequence[TokenLogprob] | None = None,
    reasoning: str = "",
) -> list[dict]:
    """The output of a finished generation: a reasoning item when the model reasoned (cut, so
    ``incomplete``, when ``max_output_tokens`` came before any answer), a message item when there
    is text (or nothing else; whitespace before calls is not text), then one function_call item per
    call, in order."""
    status = "incomplete" if finish_reason == "length" else "completed"
    items = []
    if reasoning:
        cut = status == "incomplete" and not (content or calls)
        items.append(reasoning_item(new_id("rs", token), reasoning, "incomplete" if cut else "completed"))
    if (content and content.strip()) or not calls:
        items.append(message_item(new_id("msg", token), content or "", status, logprobs))
    items.extend(call_item(new_id("fc", token), c, "completed") for c in calls)
    return items


def response_body(
    call: ResponsesCall,
    resp_id: str,
    created_at: int,
    *,
    status: str,
    output: list[dict],
    usage: dict | None = None,
    incomplete: dict | None = None,
    error: dict | None = None,
    served_by: Sequence[str] = (),
) -> dict:
    """The ``response`` object (also what stream events carry, with status in_progress/failed);
    ``served_by``: every host that served a part, named as ``hydra_served_by`` when more than one did."""
    body = {
        "id": resp_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "error": error,
        "incomplete_details": incomplete,
        "model": call.model,
        "output": output,
        "usage": usage,
        **served_by_field(served_by),
    }
    body.update(call.response_fields())
    return body


def conversation_after(call: ResponsesCall, output: Sequence[dict]) -> tuple[ChatMessage, ...]:
    """The conversation a later ``previous_response_id`` continues: this call's history (not its
    instructions, which OpenAI does not carry over) and its output as one assistant message (its
    reasoning items as the message's reasoning)."""
    text = "".join(p["text"] for item in output if item["type"] == "message" for p in item["content"])
    thoughts = "".join(p["text"] for item in output if item["type"] == "reasoning" for p in item["content"])
    calls = tuple(
        ToolCall(item["call_id"], item["name"], item["arguments"]) for item in output if item["type"] == "function_call"
    )
    return call.history + (ChatMessage("assistant", text, calls, reasoning=thoughts),)
