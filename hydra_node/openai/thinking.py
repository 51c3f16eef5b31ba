"""A reasoning model on the OpenAI-compatible API (pure): the request's reasoning controls, and
the thoughts written back into ``content`` where the client asked for them there.

Request (chat only):

* ``reasoning_effort`` (OpenAI): :func:`hydra_node.api.reasoning.effort_fields` (refused with a
  400 naming the model on a model that does not reason);
* ``chat_template_kwargs: {"enable_thinking": bool}`` (llama-server): the template's thinking
  switch; any other key is refused (we render templates with a fixed set of variables);
* ``reasoning_format`` (llama-server, per request): ``"deepseek"`` and ``"auto"`` split the
  thoughts into ``reasoning_content`` (the default), ``"none"`` leaves them in ``content``,
  between the model's own tags (``<think>…</think>``); ``"deepseek-legacy"`` is refused.

Answer: with ``reasoning_format: "none"`` — and always on ``/v1/completions``, whose choices have
only ``text`` — the thoughts are joined back into the text, tags included, as the model wrote it
(:func:`inline` for a whole answer, :class:`InlineThoughts` for a stream).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hydra_node.api.errors import bad
from hydra_node.api.reasoning import effort_fields, thinking_fields
from hydra_node.inference import ModelCaps

__all__ = ["REASONING_FORMATS", "THINK_TAGS", "Tags", "InlineThoughts", "inline", "reasoning_request", "tags_of"]

#: llama-server's per-request ``reasoning_format`` values we honour (``auto`` = ``deepseek``).
REASONING_FORMATS = ("none", "auto", "deepseek")
#: Where a model's thoughts start and end in its own text.
Tags = tuple[str, str]
#: The tags of the "think" format: how thoughts are written back into text where they must be inline.
THINK_TAGS: Tags = ("<think>", "</think>")
_TAGS: dict[str, Tags] = {
    "think": THINK_TAGS,
    "gpt-oss": ("<|channel|>analysis<|message|>", "<|end|>"),
}


def tags_of(caps: ModelCaps) -> Tags:
    """The tags around ``caps``' thoughts (``<think>``, ``</think>`` for a model that reports none)."""
    return _TAGS.get(caps.reasoning, _TAGS["think"])


@dataclass(frozen=True)
class ReasoningRequest:
    """What a chat body asks of the model's reasoning: request fields, and whether the thoughts
    go back into ``content`` (``reasoning_format: "none"``)."""

    fields: dict[str, Any]
    inline: bool = False


def reasoning_request(body: dict[str, Any], model: str, caps: Callable[[str], ModelCaps]) -> ReasoningRequest:
    """The reasoning fields of a chat ``body`` for ``model`` (``caps`` is asked only when a
    reasoning control is given). Raises :class:`ApiError` 400."""
    fields: dict[str, Any] = {}
    effort = body.get("reasoning_effort")
    if effort is not None:
        fields = effort_fields(caps(model), model, effort)
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None:
        if not isinstance(kwargs, dict):
            raise bad("'chat_template_kwargs' must be an object", "chat_template_kwargs", "invalid_type")
        for key in kwargs:
            if key != "enable_thinking":
                raise bad(
                    f"chat_template_kwargs.{key}: only 'enable_thinking' is supported (the chat template is "
                    "rendered with a fixed set of variables: docs/api.md)",
                    f"chat_template_kwargs.{key}",
                    "unsupported_parameter",
                )
        enable = kwargs.get("enable_thinking")
        param = "chat_template_kwargs.enable_thinking"
        if enable is not None:
            if not isinstance(enable, bool):
                raise bad(f"'{param}' must be a boolean", param, "invalid_type")
            switch = thinking_fields(caps(model), model, enabled=enable, budget_tokens=None, param=param)
            if effort is not None and _thinks(fields) != enable:
                raise bad(f"'reasoning_effort' {effort!r} and '{param}' {enable} disagree: send one", param)
            if effort is None:
                fields = switch
    fmt = body.get("reasoning_format")
    if fmt is not None and fmt not in REASONING_FORMATS:
        raise bad(
            f"'reasoning_format' must be one of {', '.join(REASONING_FORMATS)} ('deepseek-legacy' is not supported)",
            "reasoning_format",
        )
    return ReasoningRequest(fields, inline=fmt == "none")


def _thinks(fields: dict[str, Any]) -> bool:
    return fields.get("thinking") is not False and fields.get("thinking_budget") != 0


def inline(reasoning: str, content: str | None, tags: Tags) -> str | None:
    """``content`` with ``reasoning`` in front of it between ``tags`` (unchanged without reasoning)."""
    if not reasoning:
        return content
    return f"{tags[0]}{reasoning}{tags[1]}{content or ''}"


class InlineThoughts:
    """One streamed choice's thoughts as text: the open tag before the first, the close tag before
    whatever comes after the last (the answer, a tool call, the end)."""

    def __init__(self, tags: Tags):
        self.tags = tags
        self.open = False

    def thought(self, text: str) -> str:
        """The text to send for a piece of the thoughts."""
        if self.open:
            return text
        self.open = True
        return self.tags[0] + text

    def close(self) -> str:
        """The text to send before the next non-thought event ("" when no thought is open)."""
        if not self.open:
            return ""
        self.open = False
        return self.tags[1]
