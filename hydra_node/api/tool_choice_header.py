"""``x-hydra-tool-choice``: a request header that sets ``tool_choice`` for clients that cannot (pure).

Coding agents (Claude Code, opencode, pi, goose) never let their user choose ``tool_choice``, but
they can all send extra headers; a weak local model may need its calls forced by the grammar.
``hydra claude|opencode|pi|goose --tool-choice CHOICE`` sets this header (docs/agents.md). On
``/v1/messages`` and ``/v1/chat/completions`` it replaces the body's ``tool_choice`` when the body
offers tools (without tools there is nothing to choose and the header changes nothing):

``auto``, ``none``, ``required`` (Anthropic's ``any``; ``any`` is accepted too) or ``tool:NAME``
(that function). Anything else is a 400 naming the header.
"""

from __future__ import annotations

import json
import re

from hydra_node.api.errors import bad
from hydra_node.api.body import load_body

__all__ = ["TOOL_CHOICE_HEADER", "override_tool_choice"]

TOOL_CHOICE_HEADER = "x-hydra-tool-choice"
_NAMED = re.compile(r"tool:([A-Za-z0-9_-]{1,64})")


def _choice(value: str, dialect: str):
    v = value.strip()
    named = _NAMED.fullmatch(v)
    if dialect == "messages":
        if named:
            return {"type": "tool", "name": named.group(1)}
        kinds = {"auto": "auto", "none": "none", "required": "any", "any": "any"}
        if v in kinds:
            return {"type": kinds[v]}
    else:
        if named:
            return {"type": "function", "function": {"name": named.group(1)}}
        if v in ("auto", "none", "required", "any"):
            return "required" if v == "any" else v
    raise bad(
        f"header {TOOL_CHOICE_HEADER}: {value!r:.80} is not auto, none, required or tool:NAME", TOOL_CHOICE_HEADER
    )


def override_tool_choice(raw: bytes, value: str | None, dialect: str) -> bytes:
    """``raw`` with its ``tool_choice`` set from the header ``value`` (``dialect``: ``"messages"``
    or ``"chat"``); unchanged without the header or without tools."""
    if value is None:
        return raw
    choice = _choice(value, dialect)
    body = load_body(raw)
    if not body.get("tools"):
        return raw
    body["tool_choice"] = choice
    return json.dumps(body).encode()
