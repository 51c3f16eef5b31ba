"""Tools and tool history in the shapes a chat template is given (pure).

Two shapes (docs/tool-calling.md):

* OpenAI's, for templates that render tools themselves: ``tools`` as
  ``[{"type": "function", "function": {"name", "description", "parameters": {...}}}]``, an
  assistant's calls as ``tool_calls: [{"id", "type": "function", "function": {"name",
  "arguments"}}]``, a result as ``{"role": "tool", "tool_call_id", "name", "content"}``;
* the generic one, for templates that know nothing of tools: the tools and the answer format
  in a system message (:func:`tools_instruction`, Hermes/Qwen wording), an assistant's calls as
  ``<tool_call>`` blocks in its text, results as ``<tool_response>`` blocks in one user
  message per run of consecutive results (every template renders user messages, and a strict
  user/assistant alternation survives).

Malformed tool parameters raise :class:`~hydra_node.inference.errors.InvalidRequest`.
"""

from __future__ import annotations

import json
from typing import Any

from hydra_node.inference.errors import InvalidRequest
from hydra_node.inference.request import ChatMessage, ToolCall, ToolSpec

__all__ = [
    "ANSWER_FORMAT",
    "openai_tool",
    "openai_tool_choice",
    "openai_message",
    "choice_note",
    "tools_instruction",
    "call_block",
    "generic_messages",
    "add_instruction",
]

_INSTRUCTION_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
#: The answer format, in the words of Qwen2.5's template (also what templates with another
#: native format are told, after their own tools prompt).
ANSWER_FORMAT = (
    "For each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
_INSTRUCTION_TAIL = "</tools>\n\n" + ANSWER_FORMAT


def _parameters(spec: ToolSpec) -> dict:
    try:
        schema = json.loads(spec.parameters)
    except ValueError:
        schema = None
    if not isinstance(schema, dict):
        raise InvalidRequest(f"the parameters of tool {spec.name!r} are not a JSON object", "tools")
    return schema


def openai_tool(spec: ToolSpec) -> dict:
    return {
        "type": "function",
        "function": {"name": spec.name, "description": spec.description, "parameters": _parameters(spec)},
    }


def openai_tool_choice(choice: str, name: str) -> Any:
    """``tool_choice`` as OpenAI sends it (some templates read it)."""
    return {"type": "function", "function": {"name": name}} if choice == "function" else choice


def _arguments(call: ToolCall) -> Any:
    """The call's arguments as a JSON value; text that is not JSON stays text."""
    try:
        return json.loads(call.arguments)
    except ValueError:
        return call.arguments


def openai_message(m: ChatMessage, object_arguments: bool) -> dict:
    """``m`` in OpenAI's shape; a plain message is exactly ``{"role", "content"}``."""
    d: dict = {"role": m.role, "content": m.content}
    if m.tool_calls:
        d["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": _arguments(c) if object_arguments else c.arguments},
            }
            for c in m.tool_calls
        ]
    if m.tool_call_id:
        d["tool_call_id"] = m.tool_call_id
    if m.name:
        d["name"] = m.name
    return d


def choice_note(choice: str, name: str, parallel: bool) -> str:
    """What ``tool_choice`` and ``parallel_tool_calls`` ask of the model, in words ("" for the defaults)."""
    notes = []
    if choice == "required":
        notes.append("You must call at least one of these functions in your answer.")
    elif choice == "function":
        notes.append(f'You must call the function "{name}" in your answer.')
    if not parallel:
        notes.append("Call at most one function in your answer.")
    return " ".join(notes)


def tools_instruction(tools: list[ToolSpec], note: str) -> str:
    """The generic system text: the tools as JSON and the ``<tool_call>`` answer format."""
    listed = "\n".join(json.dumps(openai_tool(t), ensure_ascii=False) for t in tools)
    text = f"{_INSTRUCTION_HEAD}\n{listed}\n{_INSTRUCTION_TAIL}"
    return f"{text}\n\n{note}" if note else text


def call_block(call: ToolCall) -> str:
    """One call written exactly as the model is asked to write it."""
    body = json.dumps({"name": call.name, "arguments": _arguments(call)}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def generic_messages(
    messages: list[ChatMessage], tools: list[ToolSpec], note: str, *, system_role: bool = True
) -> list[dict]:
    """The history as plain ``{"role", "content"}`` messages (calls and results as blocks), with
    the tools instruction added when ``tools`` are offered."""
    out: list[dict] = []
    results_at = -1  # index in `out` of the user message that gathers the current run of results
    for m in messages:
        if m.role == "tool":
            block = f"<tool_response>\n{m.content}\n</tool_response>"
            if results_at >= 0:
                out[results_at]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block})
                results_at = len(out) - 1
            continue
        results_at = -1
        parts = ([m.content] if m.content else []) + [call_block(c) for c in m.tool_calls]
        out.append({"role": m.role, "content": "\n".join(parts)})
    if tools:
        out = add_instruction(out, tools_instruction(tools, note), system_role)
    return out


def add_instruction(messages: list[dict], text: str, system_role: bool) -> list[dict]:
    """``messages`` with ``text`` after the first system message's text (a new system message
    first when there is none); for a template that drops system messages, before the first
    user message's text instead."""
    if not text:
        return messages
    role = "system" if system_role else "user"
    for i, m in enumerate(messages):
        if m["role"] == role:
            merged = dict(m)
            if system_role:
                merged["content"] = f"{m['content']}\n\n{text}" if m["content"] else text
            else:
                merged["content"] = f"{text}\n\n{m['content']}" if m["content"] else text
            return [*messages[:i], merged, *messages[i + 1 :]]
    return [{"role": role, "content": text}, *messages]
